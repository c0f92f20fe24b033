/* Cache::Near: XS glue over nearcache's C ABI (include/nearcache.h).
 *
 * Thin like the Python glue: it converts Perl scalars to byte strings and
 * back and forwards to the engine. Plain scalars are stored with the
 * engine's native flags (bytes, UTF-8 text, 64-bit int, double, bool,
 * undef), as the Python package stores bytes/str/int/float/bool/None, so
 * either language reads what the other wrote. References and compressed
 * values go through the Perl methods _encode/_decode (serializers live in
 * Perl). Caches with callbacks (read_cb, write_cb, delete_cb) route get,
 * set and remove through the Perl methods _get_hooked, _set_hooked and
 * _remove_hooked.
 *
 * The object is a blessed hash (its options, read by the Perl methods),
 * with the engine handle attached as ext magic: `$cache->{share_file}`
 * works as in Cache::FastMmap, and the handle is found with one magic
 * lookup.
 *
 * Rule of the boundary: nothing here croaks while a Rust frame is on the
 * stack. The only code the engine calls back (the allocators) just
 * allocates; errors are turned into croaks after the call returned.
 */
#define PERL_NO_GET_CONTEXT
#include "EXTERN.h"
#include "perl.h"
#include "XSUB.h"

#include "nearcache.h"

#define FLAG_BYTES 0
#define FLAG_STR 1
#define FLAG_INT 2
#define FLAG_FLOAT 3
#define FLAG_BOOL 4
#define FLAG_NONE 5
#define FLAG_USER 16

typedef struct {
    NcCache *h;
    int64_t default_ttl_ms; /* 0: never expires */
    int hooked;             /* get/set/remove go through Perl (callbacks) */
    int perl_encode;        /* every value goes through _encode (compression, signing) */
    int signed_only;        /* native (unsigned) entries are rejected: signing is on */
    pid_t owner_pid;        /* process that opened it */
} near_t;

typedef near_t *Cache__Near;

/* ------------------------------------------------------------ errors */

static void
near_croak_status(pTHX_ NcStatus st)
{
    const char *msg = nc_last_error_message();
    croak("Cache::Near: %s (code %d)", (msg && *msg) ? msg : "error", (int)st);
}

#define CHECK(call) STMT_START { NcStatus st_ = (call); \
    if (st_ != NC_OK) near_croak_status(aTHX_ st_); } STMT_END

/* The handle lives in ext magic on the object's hash; freeing the hash
 * (DESTROY skipped at global destruction, or a failed new) frees it. */
static int
near_magic_free(pTHX_ SV *sv, MAGIC *mg)
{
    near_t *n = (near_t *)mg->mg_ptr;
    PERL_UNUSED_ARG(sv);
    if (n) {
        if (n->h)
            nc_free(n->h);
        Safefree(n);
        mg->mg_ptr = NULL;
    }
    return 0;
}

static MGVTBL near_vtbl = { 0, 0, 0, 0, near_magic_free, 0, 0, 0 };

/* The handle of an object, or NULL (not ours, or freed). */
static near_t *
near_ptr(pTHX_ SV *sv)
{
    MAGIC *mg;
    if (!(sv && SvROK(sv) && SvTYPE(SvRV(sv)) == SVt_PVHV))
        return NULL;
    mg = mg_findext(SvRV(sv), PERL_MAGIC_ext, &near_vtbl);
    return mg ? (near_t *)mg->mg_ptr : NULL;
}

static near_t *
near_from_sv(pTHX_ SV *sv)
{
    near_t *n = near_ptr(aTHX_ sv);
    if (!n) {
        if (!(sv && SvROK(sv) && SvOBJECT(SvRV(sv))))
            croak("Cache::Near: method called on something that is not a Cache::Near object");
        croak("Cache::Near: the cache is closed");
    }
    if (!n->h)
        croak("Cache::Near: the cache is closed");
    return n;
}

/* ------------------------------------------------------------ keys */

/* The bytes of a key: its UTF-8 encoding (Perl strings are text; a
 * string without the UTF-8 flag is upgraded), so equal Perl strings are
 * always the same key, and the same key as the equal Python str. A
 * reference is its string form ("ARRAY(0x...)"), as in Cache::FastMmap.
 * The empty key, which the engine refuses, is stored as the single byte
 * 0xFE: the escape byte of nearcache's key encoding followed by no bytes
 * (the stored form of the empty bytes key), never produced by text.
 * Returns NULL for a key longer than the engine takes (64 KiB): it can
 * never be stored, so reads miss and writes store nothing. */
static const char *
near_key(pTHX_ SV *key, STRLEN *len)
{
    const char *p;
    SvGETMAGIC(key);
    if (!SvOK(key))
        croak("Cache::Near: the key is undefined");
    p = SvPV_nomg(key, *len);
    if (*len == 0) {
        *len = 1;
        return "\xFE";
    }
    if (!SvUTF8(key) && !is_utf8_invariant_string((const U8 *)p, *len)) {
        SV *copy = sv_2mortal(newSVpvn(p, *len));
        sv_utf8_upgrade(copy);
        p = SvPV(copy, *len);
    }
    if (*len > nc_max_key_len())
        return NULL;
    return p;
}

static SV *
near_key_sv(pTHX_ const uint8_t *k, size_t len)
{
    SV *sv;
    if (len == 1 && k[0] == 0xFE)
        return newSVpvs("");
    sv = newSVpvn((const char *)k, len);
    if (!is_utf8_invariant_string(k, len))
        SvUTF8_on(sv);
    return sv;
}

/* ------------------------------------------------------------ values out */

typedef struct {
    SV *sv;
    uint32_t flags;
} near_slot;

static uint8_t *
near_alloc(void *ctx, size_t len, uint32_t flags)
{
    dTHX;
    near_slot *slot = (near_slot *)ctx;
    SV *sv;
    /* A get reads optimistically: after a race with a writer it asks
     * again, and the buffer it asked for before is no longer wanted. */
    if (slot->sv) {
        SvREFCNT_dec(slot->sv);
        slot->sv = NULL;
    }
    sv = newSV(len + 1);
    SvPOK_on(sv);
    SvCUR_set(sv, len);
    *SvEND(sv) = '\0';
    slot->sv = sv;
    slot->flags = flags;
    return (uint8_t *)SvPVX(sv);
}

typedef struct {
    near_slot *slots;
} near_many;

static uint8_t *
near_alloc_at(void *ctx, size_t index, size_t len, uint32_t flags)
{
    near_many *m = (near_many *)ctx;
    return near_alloc(&m->slots[index], len, flags);
}

/* Turn a fetched payload (owned SV) into the Perl value; NULL means
 * "treat as a miss" (malformed native payload or a rejected entry). */
static SV *
near_decode(pTHX_ SV *self, SV *key, SV *payload, uint32_t flags, int signed_only)
{
    STRLEN len = SvCUR(payload);
    const U8 *p = (const U8 *)SvPVX(payload);
    if (signed_only && flags < FLAG_USER) {
        SvREFCNT_dec(payload);
        return NULL;
    }
    switch (flags) {
    case FLAG_BYTES:
        return payload;
    case FLAG_STR:
        if (!is_utf8_string(p, len))
            break;
        SvUTF8_on(payload);
        return payload;
    case FLAG_INT:
        if (len == 8) {
            int64_t v;
            memcpy(&v, p, 8); /* little-endian hosts only (the engine's files are LE) */
            SvREFCNT_dec(payload);
            return newSViv((IV)v);
        }
        break;
    case FLAG_FLOAT:
        if (len == 8) {
            double v;
            memcpy(&v, p, 8);
            SvREFCNT_dec(payload);
            return newSVnv(v);
        }
        break;
    case FLAG_BOOL:
        if (len == 1 && p[0] <= 1) {
            int b = p[0];
            SvREFCNT_dec(payload);
            return newSVsv(b ? &PL_sv_yes : &PL_sv_no);
        }
        break;
    case FLAG_NONE:
        if (len == 0) {
            SvREFCNT_dec(payload);
            return newSV(0);
        }
        break;
    default:
        if (flags >= FLAG_USER) {
            /* Serialized or compressed: Perl decodes (or rejects). */
            dSP;
            int count;
            SV *out = NULL;
            ENTER;
            SAVETMPS;
            PUSHMARK(SP);
            EXTEND(SP, 4);
            PUSHs(self);
            mPUSHu(flags);
            PUSHs(sv_2mortal(payload));
            PUSHs(key);
            PUTBACK;
            count = call_method("_decode", G_LIST);
            SPAGAIN;
            if (count == 1)
                out = newSVsv(POPs);
            else
                SP -= count;
            PUTBACK;
            FREETMPS;
            LEAVE;
            return out;
        }
    }
    SvREFCNT_dec(payload);
    return NULL;
}

/* ------------------------------------------------------------ values in */

typedef struct {
    const char *ptr;
    STRLEN len;
    uint32_t flags;
    char small[8];
} near_encoded;

/* Encode a plain scalar natively. Returns 0 if the value needs Perl
 * (a reference, or compression is on). */
static int
near_encode_native(pTHX_ near_t *n, SV *v, near_encoded *e)
{
    SvGETMAGIC(v);
    if (n->perl_encode || SvROK(v))
        return 0;
    if (!SvOK(v)) {
        e->ptr = "";
        e->len = 0;
        e->flags = FLAG_NONE;
        return 1;
    }
#ifdef SvIsBOOL
    if (SvIsBOOL(v)) {
        e->small[0] = SvTRUE_nomg(v) ? 1 : 0;
        e->ptr = e->small;
        e->len = 1;
        e->flags = FLAG_BOOL;
        return 1;
    }
#endif
    if (!SvPOK(v) && SvIOK(v) && !(SvIsUV(v) && SvUVX(v) > (UV)IV_MAX)) {
        int64_t i = (int64_t)SvIVX(v);
        memcpy(e->small, &i, 8);
        e->ptr = e->small;
        e->len = 8;
        e->flags = FLAG_INT;
        return 1;
    }
    if (!SvPOK(v) && !SvIOK(v) && SvNOK(v)) {
        double d = SvNVX(v);
        memcpy(e->small, &d, 8);
        e->ptr = e->small;
        e->len = 8;
        e->flags = FLAG_FLOAT;
        return 1;
    }
    e->ptr = SvPV_nomg(v, e->len);
    e->flags = SvUTF8(v) ? FLAG_STR : FLAG_BYTES;
    return 1;
}

/* Encode any value: natively, or through the Perl method _encode, which
 * returns (flags, payload). The payload SV is kept alive as a mortal. */
static void
near_encode(pTHX_ near_t *n, SV *self, SV *key, SV *v, near_encoded *e)
{
    dSP;
    int count;
    SV *payload;
    if (near_encode_native(aTHX_ n, v, e))
        return;
    ENTER;
    PUSHMARK(SP);
    EXTEND(SP, 3);
    PUSHs(self);
    PUSHs(v);
    PUSHs(key);
    PUTBACK;
    count = call_method("_encode", G_LIST);
    SPAGAIN;
    if (count != 2)
        croak("Cache::Near: _encode returned %d values instead of (flags, payload)", count);
    payload = POPs;
    e->flags = (uint32_t)POPu;
    PUTBACK;
    /* Keep the payload alive past LEAVE: a new mortal in the caller's scope. */
    payload = sv_2mortal(newSVsv(payload));
    LEAVE;
    e->ptr = SvPV(payload, e->len);
}

/* ------------------------------------------------------------ expiry */

/* Milliseconds of an expire argument: undef means the cache's default;
 * a number is seconds; anything else (e.g. "10m", "never") is parsed by
 * the Perl method _expire_ms. */
static int64_t
near_ttl_ms(pTHX_ near_t *n, SV *self, SV *expire)
{
    if (!expire || !SvOK(expire))
        return n->default_ttl_ms;
    if (SvIOK(expire) && !SvPOK(expire)) {
        IV s = SvIVX(expire);
        if (s < 0)
            croak("Cache::Near: expire time must be >= 0 seconds, got %" IVdf, s);
        return (int64_t)s * 1000;
    }
    {
        dSP;
        int count;
        int64_t ms;
        ENTER;
        SAVETMPS;
        PUSHMARK(SP);
        EXTEND(SP, 2);
        PUSHs(self);
        PUSHs(expire);
        PUTBACK;
        count = call_method("_expire_ms", G_SCALAR);
        SPAGAIN;
        ms = count == 1 ? (int64_t)POPi : 0;
        PUTBACK;
        FREETMPS;
        LEAVE;
        return ms;
    }
}

/* ------------------------------------------------------------ operations */

/* Fetch the stored form of a key: NULL on a miss, else an owned SV with
 * the payload, *flags set. The allocator may have been called by a read
 * that raced a writer and then missed: that buffer is freed here. */
static SV *
near_fetch(pTHX_ near_t *n, const char *k, STRLEN klen, uint32_t *flags)
{
    near_slot slot = { NULL, 0 };
    bool found = false;
    NcStatus st = nc_get(n->h, (const uint8_t *)k, klen, near_alloc, &slot, &found);
    if (st != NC_OK || !found) {
        if (slot.sv)
            SvREFCNT_dec(slot.sv);
        if (st != NC_OK)
            near_croak_status(aTHX_ st);
        return NULL;
    }
    *flags = slot.flags;
    return slot.sv;
}

static SV *
near_get(pTHX_ near_t *n, SV *self, SV *key)
{
    STRLEN klen;
    const char *k = near_key(aTHX_ key, &klen);
    uint32_t flags = 0;
    SV *payload;
    if (!k)
        return NULL;
    payload = near_fetch(aTHX_ n, k, klen, &flags);
    if (!payload)
        return NULL;
    return near_decode(aTHX_ self, key, payload, flags, n->signed_only);
}

/* Store; returns whether stored. A key too long to store stores nothing. */
static int
near_store(pTHX_ near_t *n, SV *self, SV *key, SV *value, SV *expire, uint32_t mode)
{
    STRLEN klen;
    const char *k = near_key(aTHX_ key, &klen);
    int64_t ttl = near_ttl_ms(aTHX_ n, self, expire);
    near_encoded e;
    bool stored = false;
    if (!k)
        return 0;
    near_encode(aTHX_ n, self, key, value, &e);
    CHECK(nc_store(n->h, (const uint8_t *)k, klen, (const uint8_t *)e.ptr, e.len, e.flags, ttl,
                   mode, &stored));
    return stored;
}

static SV *
near_call_hook(pTHX_ const char *method, SV *self, SV **args, int nargs, I32 ctx)
{
    dSP;
    int i, count;
    SV *out = &PL_sv_undef;
    ENTER;
    SAVETMPS;
    PUSHMARK(SP);
    EXTEND(SP, nargs + 1);
    PUSHs(self);
    for (i = 0; i < nargs; i++)
        PUSHs(args[i] ? args[i] : &PL_sv_undef);
    PUTBACK;
    count = call_method(method, ctx);
    SPAGAIN;
    if (count >= 1)
        out = newSVsv(POPs);
    PUTBACK;
    FREETMPS;
    LEAVE;
    return out == &PL_sv_undef ? newSV(0) : out;
}

/* Key visitor of _keys: runs under a shard lock, so it only allocates. */
static void
near_collect_key(void *ctx, const uint8_t *key, size_t key_len, size_t value_len, uint32_t flags,
                 uint64_t expires_ms)
{
    dTHX;
    AV *row = newAV();
    av_extend(row, 3);
    av_push(row, newSVpvn((const char *)key, key_len));
    av_push(row, newSVuv((UV)value_len));
    av_push(row, newSVuv((UV)flags));
    av_push(row, newSVuv((UV)expires_ms));
    av_push((AV *)ctx, newRV_noinc((SV *)row));
}

/* The allocator of exists: notes the flags, copies nothing. */
static uint8_t *
near_alloc_none(void *ctx, size_t len, uint32_t flags)
{
    PERL_UNUSED_ARG(len);
    *(uint32_t *)ctx = flags;
    return NULL;
}

MODULE = Cache::Near    PACKAGE = Cache::Near    PREFIX = near_

PROTOTYPES: DISABLE

SV *
_open(class, path, size, shards, create, recreate, allow_foreign_owner, lock_timeout_ms, spill_threshold, spill_budget, no_spill, fs_reserve, no_fs_reserve, default_ttl_ms, hooked, perl_encode, signed_only, self)
        const char *class
        const char *path
        UV size
        UV shards
        bool create
        bool recreate
        bool allow_foreign_owner
        UV lock_timeout_ms
        UV spill_threshold
        UV spill_budget
        bool no_spill
        UV fs_reserve
        bool no_fs_reserve
        IV default_ttl_ms
        bool hooked
        bool perl_encode
        bool signed_only
        SV *self
    CODE:
    {
        /* self: a reference to the hash of options that becomes the object. */
        NcOpenOptions o;
        NcCache *h = NULL;
        near_t *n;
        if (!(SvROK(self) && SvTYPE(SvRV(self)) == SVt_PVHV))
            croak("Cache::Near: _open needs a hash reference");
        if (near_ptr(aTHX_ self))
            croak("Cache::Near: this object is already open");
        Zero(&o, 1, NcOpenOptions);
        if (default_ttl_ms < 0)
            croak("Cache::Near: expire_time must be >= 0");
        o.size = size;
        o.shards = (uint32_t)shards;
        o.create = create;
        o.recreate = recreate;
        o.allow_foreign_owner = allow_foreign_owner;
        if (lock_timeout_ms > 0xFFFFFFFFu)
            croak("Cache::Near: lock_timeout is too large");
        o.lock_timeout_ms = (uint32_t)lock_timeout_ms;
        o.spill_threshold = (uint64_t)spill_threshold; /* 0: the engine's default */
        o.spill_budget = (uint64_t)spill_budget;       /* 0: the engine's default */
        o.no_spill = no_spill;
        o.fs_reserve = (uint64_t)fs_reserve; /* 0: the engine's default */
        o.no_fs_reserve = no_fs_reserve;
        CHECK(nc_open(path, &o, &h));
        Newxz(n, 1, near_t);
        n->h = h;
        n->default_ttl_ms = default_ttl_ms;
        n->hooked = hooked;
        n->perl_encode = perl_encode;
        n->signed_only = signed_only;
        n->owner_pid = getpid();
        sv_magicext(SvRV(self), NULL, PERL_MAGIC_ext, &near_vtbl, (const char *)n, 0);
        RETVAL = sv_bless(newRV_inc(SvRV(self)), gv_stashpv(class, GV_ADD));
    }
    OUTPUT:
        RETVAL

void
near__set_mode(self, hooked, perl_encode)
        SV *self
        bool hooked
        bool perl_encode
    CODE:
    {
        /* Route get/set/remove through Perl (hooked), or encode every value in Perl. */
        near_t *n = near_from_sv(aTHX_ self);
        n->hooked = hooked;
        n->perl_encode = perl_encode;
    }

void
near__free(self)
        SV *self
    CODE:
    {
        near_t *n = near_ptr(aTHX_ self);
        if (n && n->h) {
            nc_free(n->h);
            n->h = NULL;
        }
    }

void
near_close(self)
        SV *self
    CODE:
    {
        near_t *n = near_ptr(aTHX_ self);
        if (!n && !(SvROK(self) && SvOBJECT(SvRV(self))))
            croak("Cache::Near: close called on something that is not a Cache::Near object");
        if (n && n->h) {
            nc_free(n->h);
            n->h = NULL;
        }
    }

bool
near_is_closed(self)
        SV *self
    CODE:
    {
        near_t *n = near_ptr(aTHX_ self);
        RETVAL = !n || !n->h;
    }
    OUTPUT:
        RETVAL

IV
near__owner_pid(self)
        SV *self
    CODE:
    {
        near_t *n = near_ptr(aTHX_ self);
        RETVAL = n ? (IV)n->owner_pid : 0;
    }
    OUTPUT:
        RETVAL

SV *
near_get(self, key, opts = NULL)
        SV *self
        SV *key
        SV *opts
    CODE:
    {
        near_t *n = near_from_sv(aTHX_ self);
        if (n->hooked || (opts && SvOK(opts))) {
            SV *args[2] = { key, opts };
            RETVAL = near_call_hook(aTHX_ "_get_full", self, args, 2, G_SCALAR);
        } else {
            RETVAL = near_get(aTHX_ n, self, key);
            if (!RETVAL)
                RETVAL = newSV(0);
        }
    }
    OUTPUT:
        RETVAL

void
near__get_plain(self, key)
        SV *self
        SV *key
    PPCODE:
    {
        /* () on a miss, (value) on a hit: tells a stored undef from a miss. */
        near_t *n = near_from_sv(aTHX_ self);
        SV *v = near_get(aTHX_ n, self, key);
        if (v)
            mXPUSHs(v);
    }

SV *
near_set(self, key, value, expire = NULL)
        SV *self
        SV *key
        SV *value
        SV *expire
    CODE:
    {
        near_t *n = near_from_sv(aTHX_ self);
        /* Perl takes callbacks, write-back, tombstones, an options hash
         * and expire times that are not plain integers ('10m', 'now'). */
        if (n->hooked || (expire && SvOK(expire) && (SvROK(expire) || !SvIOK(expire) || SvPOK(expire)))) {
            SV *args[3] = { key, value, expire };
            RETVAL = near_call_hook(aTHX_ "_set_full", self, args, 3, G_SCALAR);
        } else {
            RETVAL = newSViv(near_store(aTHX_ n, self, key, value, expire, NC_SET) ? 1 : 0);
        }
    }
    OUTPUT:
        RETVAL

bool
near__store_plain(self, key, value, expire, mode)
        SV *self
        SV *key
        SV *value
        SV *expire
        UV mode
    CODE:
        RETVAL = near_store(aTHX_ near_from_sv(aTHX_ self), self, key, value, expire, (uint32_t)mode);
    OUTPUT:
        RETVAL

bool
near__store_raw(self, key, flags, payload, ttl_ms, mode)
        SV *self
        SV *key
        UV flags
        SV *payload
        IV ttl_ms
        UV mode
    CODE:
    {
        /* Store an already encoded (flags, payload); ttl_ms 0: never expires. */
        near_t *n = near_from_sv(aTHX_ self);
        STRLEN klen, plen;
        const char *k = near_key(aTHX_ key, &klen);
        const char *p = SvPV(payload, plen);
        bool stored = false;
        if (ttl_ms < 0)
            croak("Cache::Near: ttl must be >= 0 ms");
        if (!k)
            XSRETURN_NO;
        CHECK(nc_store(n->h, (const uint8_t *)k, klen, (const uint8_t *)p, plen, (uint32_t)flags,
                       (int64_t)ttl_ms, (uint32_t)mode, &stored));
        RETVAL = stored;
    }
    OUTPUT:
        RETVAL

bool
near__remove_plain(self, key)
        SV *self
        SV *key
    CODE:
    {
        near_t *n = near_from_sv(aTHX_ self);
        STRLEN klen;
        const char *k = near_key(aTHX_ key, &klen);
        bool deleted = false;
        if (k)
            CHECK(nc_delete(n->h, (const uint8_t *)k, klen, &deleted));
        RETVAL = deleted;
    }
    OUTPUT:
        RETVAL

SV *
near_remove(self, key, opts = NULL)
        SV *self
        SV *key
        SV *opts
    CODE:
    {
        near_t *n = near_from_sv(aTHX_ self);
        if (n->hooked || (opts && SvOK(opts))) {
            SV *args[2] = { key, opts };
            RETVAL = near_call_hook(aTHX_ "_remove_full", self, args, 2, G_SCALAR);
        } else {
            STRLEN klen;
            const char *k = near_key(aTHX_ key, &klen);
            bool deleted = false;
            if (k)
                CHECK(nc_delete(n->h, (const uint8_t *)k, klen, &deleted));
            RETVAL = newSViv(deleted ? 1 : 0);
        }
    }
    OUTPUT:
        RETVAL

void
near__raw_get(self, key)
        SV *self
        SV *key
    PPCODE:
    {
        /* () on a miss, (flags, payload) on a hit: the stored form. */
        near_t *n = near_from_sv(aTHX_ self);
        STRLEN klen;
        const char *k = near_key(aTHX_ key, &klen);
        uint32_t flags = 0;
        SV *payload = k ? near_fetch(aTHX_ n, k, klen, &flags) : NULL;
        if (payload) {
            EXTEND(SP, 2);
            mPUSHu(flags);
            mPUSHs(payload);
        }
    }

SV *
near__exists_flags(self, key)
        SV *self
        SV *key
    CODE:
    {
        /* The flags of a present key (nothing copied), undef if absent. */
        near_t *n = near_from_sv(aTHX_ self);
        STRLEN klen;
        const char *k = near_key(aTHX_ key, &klen);
        uint32_t flags = 0;
        bool found = false;
        if (k)
            CHECK(nc_get(n->h, (const uint8_t *)k, klen, near_alloc_none, &flags, &found));
        RETVAL = found ? newSVuv((UV)flags) : newSV(0);
    }
    OUTPUT:
        RETVAL

bool
near__delete_if_equals(self, key, payload)
        SV *self
        SV *key
        SV *payload
    CODE:
    {
        near_t *n = near_from_sv(aTHX_ self);
        STRLEN klen, plen;
        const char *k = near_key(aTHX_ key, &klen);
        const char *p = SvPV(payload, plen);
        bool deleted = false;
        if (k)
            CHECK(nc_delete_if_equals(n->h, (const uint8_t *)k, klen, (const uint8_t *)p, plen, &deleted));
        RETVAL = deleted;
    }
    OUTPUT:
        RETVAL

void
near__pop_raw(self, key)
        SV *self
        SV *key
    PPCODE:
    {
        /* () on a miss, (flags, payload) of the entry it removed on a hit. */
        near_t *n = near_from_sv(aTHX_ self);
        STRLEN klen;
        const char *k = near_key(aTHX_ key, &klen);
        near_slot slot = { NULL, 0 };
        bool found = false;
        NcStatus st;
        if (!k)
            XSRETURN_EMPTY;
        st = nc_pop(n->h, (const uint8_t *)k, klen, near_alloc, &slot, &found);
        if (st != NC_OK || !found) {
            if (slot.sv)
                SvREFCNT_dec(slot.sv);
            if (st != NC_OK)
                near_croak_status(aTHX_ st);
            XSRETURN_EMPTY;
        }
        EXTEND(SP, 2);
        mPUSHu(slot.flags);
        mPUSHs(slot.sv);
    }

void
near__decode_stored(self, key, flags, payload)
        SV *self
        SV *key
        UV flags
        SV *payload
    PPCODE:
    {
        /* (value) of a stored (flags, payload), () if it is to be a miss. */
        near_t *n = near_from_sv(aTHX_ self);
        STRLEN len;
        const char *p = SvPV(payload, len);
        SV *v = near_decode(aTHX_ self, key, newSVpvn(p, len), (uint32_t)flags, n->signed_only);
        if (v)
            mXPUSHs(v);
    }

void
near__encode_value(self, key, value)
        SV *self
        SV *key
        SV *value
    PPCODE:
    {
        /* (flags, payload) as set would store the value. */
        near_t *n = near_from_sv(aTHX_ self);
        near_encoded e;
        near_encode(aTHX_ n, self, key, value, &e);
        EXTEND(SP, 2);
        mPUSHu(e.flags);
        mPUSHs(newSVpvn(e.ptr, e.len));
    }

IV
near__ttl_ms(self, expire)
        SV *self
        SV *expire
    CODE:
        RETVAL = (IV)near_ttl_ms(aTHX_ near_from_sv(aTHX_ self), self, expire);
    OUTPUT:
        RETVAL

bool
near__have_cas(...)
    CODE:
#ifdef NEAR_HAVE_CAS
        RETVAL = 1;
#else
        RETVAL = 0;
#endif
    OUTPUT:
        RETVAL

#ifdef NEAR_HAVE_CAS

void
near__get_versioned(self, key)
        SV *self
        SV *key
    PPCODE:
    {
        /* () on a miss, (flags, payload, version) on a hit. */
        near_t *n = near_from_sv(aTHX_ self);
        STRLEN klen;
        const char *k = near_key(aTHX_ key, &klen);
        near_slot slot = { NULL, 0 };
        bool found = false;
        uint64_t version = 0;
        NcStatus st;
        if (!k)
            XSRETURN_EMPTY;
        st = nc_get_versioned(n->h, (const uint8_t *)k, klen, near_alloc, &slot, &found, &version);
        if (st != NC_OK || !found) {
            if (slot.sv)
                SvREFCNT_dec(slot.sv);
            if (st != NC_OK)
                near_croak_status(aTHX_ st);
            XSRETURN_EMPTY;
        }
        EXTEND(SP, 3);
        mPUSHu(slot.flags);
        mPUSHs(slot.sv);
        mPUSHu((UV)version);
    }

void
near__cas(self, key, flags, payload, ttl_ms, expected)
        SV *self
        SV *key
        UV flags
        SV *payload
        IV ttl_ms
        UV expected
    PPCODE:
    {
        /* (stored, current_version): store only if the key's version is
         * still `expected` (0: only if absent). */
        near_t *n = near_from_sv(aTHX_ self);
        STRLEN klen, plen;
        const char *k = near_key(aTHX_ key, &klen);
        const char *p = SvPV(payload, plen);
        bool stored = false;
        uint64_t current = 0;
        if (ttl_ms < 0)
            croak("Cache::Near: ttl must be >= 0 ms");
        if (k)
            CHECK(nc_cas(n->h, (const uint8_t *)k, klen, (const uint8_t *)p, plen, (uint32_t)flags,
                         (int64_t)ttl_ms, (uint64_t)expected, &stored, &current));
        EXTEND(SP, 2);
        mPUSHi(stored ? 1 : 0);
        mPUSHu((UV)current);
    }

bool
near__delete_if_version(self, key, expected)
        SV *self
        SV *key
        UV expected
    CODE:
    {
        near_t *n = near_from_sv(aTHX_ self);
        STRLEN klen;
        const char *k = near_key(aTHX_ key, &klen);
        bool deleted = false;
        if (k)
            CHECK(nc_delete_if_version(n->h, (const uint8_t *)k, klen, (uint64_t)expected, &deleted));
        RETVAL = deleted;
    }
    OUTPUT:
        RETVAL

#endif

bool
near_touch(self, key, expire = NULL)
        SV *self
        SV *key
        SV *expire
    CODE:
    {
        near_t *n = near_from_sv(aTHX_ self);
        STRLEN klen;
        const char *k = near_key(aTHX_ key, &klen);
        int64_t ttl = near_ttl_ms(aTHX_ n, self, expire);
        bool found = false;
        if (k)
            CHECK(nc_touch(n->h, (const uint8_t *)k, klen, ttl, &found));
        RETVAL = found;
    }
    OUTPUT:
        RETVAL

SV *
near_expires_at(self, key)
        SV *self
        SV *key
    CODE:
    {
        /* Unix time in seconds (fractional) the entry expires at, 0 for
         * never, undef if absent. */
        near_t *n = near_from_sv(aTHX_ self);
        STRLEN klen;
        const char *k = near_key(aTHX_ key, &klen);
        bool found = false;
        uint64_t ms = 0;
        if (k)
            CHECK(nc_expires_at(n->h, (const uint8_t *)k, klen, &found, &ms));
        RETVAL = found ? newSVnv((NV)ms / 1000.0) : newSV(0);
    }
    OUTPUT:
        RETVAL

IV
near__incr(self, key, delta, initial, expire)
        SV *self
        SV *key
        IV delta
        SV *initial
        SV *expire
    CODE:
    {
        near_t *n = near_from_sv(aTHX_ self);
        STRLEN klen;
        const char *k = near_key(aTHX_ key, &klen);
        int64_t ttl = near_ttl_ms(aTHX_ n, self, expire);
        int64_t out = 0;
        bool has_initial = SvOK(initial);
        IV init = has_initial ? SvIV(initial) : 0;
        if (!k)
            croak("Cache::Near: the key is longer than %lu bytes", (unsigned long)nc_max_key_len());
        CHECK(nc_incr(n->h, (const uint8_t *)k, klen, (int64_t)delta, has_initial, (int64_t)init,
                      ttl, &out));
        RETVAL = (IV)out;
    }
    OUTPUT:
        RETVAL

SV *
near__get_many(self, keys)
        SV *self
        SV *keys
    CODE:
    {
        /* A hashref of the hits among the keys in the arrayref. */
        near_t *n = near_from_sv(aTHX_ self);
        AV *av;
        SSize_t i, count;
        NcBytes *kb;
        near_many m;
        HV *out;
        NcStatus st;
        if (!(SvROK(keys) && SvTYPE(SvRV(keys)) == SVt_PVAV))
            croak("Cache::Near: expected an array reference of keys");
        av = (AV *)SvRV(keys);
        count = av_len(av) + 1;
        Newxz(kb, count ? count : 1, NcBytes);
        SAVEFREEPV(kb);
        Newxz(m.slots, count ? count : 1, near_slot);
        SAVEFREEPV(m.slots);
        for (i = 0; i < count; i++) {
            SV **k = av_fetch(av, i, 0);
            STRLEN klen;
            const char *p = near_key(aTHX_ k ? *k : &PL_sv_undef, &klen);
            /* A key too long to be stored misses: it is looked up as
             * 0xFF alone, the integer-key marker with no digits, a stored
             * form no binding ever writes. */
            kb[i].ptr = (const uint8_t *)(p ? p : "\xFF");
            kb[i].len = p ? klen : 1;
        }
        st = nc_get_many(n->h, kb, (size_t)count, near_alloc_at, &m);
        out = newHV();
        RETVAL = newRV_noinc((SV *)out);
        for (i = 0; i < count; i++) {
            if (m.slots[i].sv) {
                if (st != NC_OK) {
                    SvREFCNT_dec(m.slots[i].sv);
                } else {
                    SV **k = av_fetch(av, i, 0);
                    SV *v = near_decode(aTHX_ self, *k, m.slots[i].sv, m.slots[i].flags, n->signed_only);
                    if (v && !hv_store_ent(out, *k, v, 0))
                        SvREFCNT_dec(v);
                }
            }
        }
        if (st != NC_OK) {
            SvREFCNT_dec(RETVAL);
            near_croak_status(aTHX_ st);
        }
    }
    OUTPUT:
        RETVAL

SV *
near__raw_get_many(self, keys)
        SV *self
        SV *keys
    CODE:
    {
        /* A hashref key => [flags, payload] of the hits among the keys in
         * the arrayref: the stored forms, one engine call. */
        near_t *n = near_from_sv(aTHX_ self);
        AV *av;
        SSize_t i, count;
        NcBytes *kb;
        near_many m;
        HV *out;
        NcStatus st;
        if (!(SvROK(keys) && SvTYPE(SvRV(keys)) == SVt_PVAV))
            croak("Cache::Near: expected an array reference of keys");
        av = (AV *)SvRV(keys);
        count = av_len(av) + 1;
        Newxz(kb, count ? count : 1, NcBytes);
        SAVEFREEPV(kb);
        Newxz(m.slots, count ? count : 1, near_slot);
        SAVEFREEPV(m.slots);
        for (i = 0; i < count; i++) {
            SV **k = av_fetch(av, i, 0);
            STRLEN klen;
            const char *p = near_key(aTHX_ k ? *k : &PL_sv_undef, &klen);
            kb[i].ptr = (const uint8_t *)(p ? p : "\xFF");
            kb[i].len = p ? klen : 1;
        }
        st = nc_get_many(n->h, kb, (size_t)count, near_alloc_at, &m);
        out = newHV();
        RETVAL = newRV_noinc((SV *)out);
        for (i = 0; i < count; i++) {
            if (!m.slots[i].sv)
                continue;
            if (st != NC_OK) {
                SvREFCNT_dec(m.slots[i].sv);
            } else {
                SV **k = av_fetch(av, i, 0);
                AV *pair = newAV();
                av_push(pair, newSVuv((UV)m.slots[i].flags));
                av_push(pair, m.slots[i].sv);
                (void)hv_store_ent(out, *k, newRV_noinc((SV *)pair), 0);
            }
        }
        if (st != NC_OK) {
            SvREFCNT_dec(RETVAL);
            near_croak_status(aTHX_ st);
        }
    }
    OUTPUT:
        RETVAL

void
near__set_many(self, pairs, expire)
        SV *self
        SV *pairs
        SV *expire
    CODE:
    {
        /* pairs: arrayref [key, value, key, value, ...]; one expiry. Keys
         * too long to be stored are left out. */
        near_t *n = near_from_sv(aTHX_ self);
        AV *av;
        SSize_t i, count, used = 0;
        NcItem *items;
        int64_t ttl = near_ttl_ms(aTHX_ n, self, expire);
        if (!(SvROK(pairs) && SvTYPE(SvRV(pairs)) == SVt_PVAV))
            croak("Cache::Near: expected an array reference of key/value pairs");
        av = (AV *)SvRV(pairs);
        count = (av_len(av) + 1) / 2;
        Newxz(items, count ? count : 1, NcItem);
        SAVEFREEPV(items);
        for (i = 0; i < count; i++) {
            SV **k = av_fetch(av, 2 * i, 0);
            SV **v = av_fetch(av, 2 * i + 1, 0);
            STRLEN klen;
            near_encoded e;
            const char *p = near_key(aTHX_ k ? *k : &PL_sv_undef, &klen);
            if (!p)
                continue;
            items[used].key.ptr = (const uint8_t *)p;
            items[used].key.len = klen;
            near_encode(aTHX_ n, self, *k, v ? *v : &PL_sv_undef, &e);
            if (e.ptr == e.small) {
                /* Native numbers live in `e`, which is reused: copy to a mortal. */
                SV *copy = sv_2mortal(newSVpvn(e.small, e.len));
                e.ptr = SvPVX(copy);
            }
            items[used].value.ptr = (const uint8_t *)e.ptr;
            items[used].value.len = e.len;
            items[used].flags = e.flags;
            used++;
        }
        CHECK(nc_set_many(n->h, items, (size_t)used, ttl));
    }

IV
near__delete_many(self, keys)
        SV *self
        SV *keys
    CODE:
    {
        near_t *n = near_from_sv(aTHX_ self);
        AV *av;
        SSize_t i, count, used = 0;
        NcBytes *kb;
        size_t deleted = 0;
        if (!(SvROK(keys) && SvTYPE(SvRV(keys)) == SVt_PVAV))
            croak("Cache::Near: expected an array reference of keys");
        av = (AV *)SvRV(keys);
        count = av_len(av) + 1;
        Newxz(kb, count ? count : 1, NcBytes);
        SAVEFREEPV(kb);
        for (i = 0; i < count; i++) {
            SV **k = av_fetch(av, i, 0);
            STRLEN klen;
            const char *p = near_key(aTHX_ k ? *k : &PL_sv_undef, &klen);
            if (!p)
                continue;
            kb[used].ptr = (const uint8_t *)p;
            kb[used].len = klen;
            used++;
        }
        CHECK(nc_delete_many(n->h, kb, (size_t)used, &deleted));
        RETVAL = (IV)deleted;
    }
    OUTPUT:
        RETVAL

void
near__clear(self)
        SV *self
    CODE:
        CHECK(nc_clear(near_from_sv(aTHX_ self)->h));

UV
near_count(self)
        SV *self
    CODE:
    {
        size_t count = 0;
        CHECK(nc_len(near_from_sv(aTHX_ self)->h, &count));
        RETVAL = (UV)count;
    }
    OUTPUT:
        RETVAL

void
near__keys(self, with_meta)
        SV *self
        bool with_meta
    PPCODE:
    {
        /* Every key, or [key, value_len, flags, expires_ms] per key. The
         * visitor only collects raw rows (it runs under a shard lock). */
        near_t *n = near_from_sv(aTHX_ self);
        AV *rows = (AV *)sv_2mortal((SV *)newAV());
        SSize_t i, count;
        CHECK(nc_keys(n->h, near_collect_key, rows));
        count = av_len(rows) + 1;
        EXTEND(SP, count);
        for (i = 0; i < count; i++) {
            SV **row = av_fetch(rows, i, 0);
            AV *r = (AV *)SvRV(*row);
            SV *key = *av_fetch(r, 0, 0);
            STRLEN klen;
            const char *k = SvPV(key, klen);
            SV *ks;
            /* Keys that are not UTF-8 (bytes keys written by Python) cannot
             * be named by a Perl string: not listed. The empty key's
             * stored form (0xFE) is listed as "". */
            if (!(klen == 1 && (U8)k[0] == 0xFE) && !is_utf8_string((const U8 *)k, klen))
                continue;
            ks = near_key_sv(aTHX_ (const uint8_t *)k, klen);
            if (with_meta) {
                AV *meta = newAV();
                av_push(meta, ks);
                av_push(meta, newSVsv(*av_fetch(r, 1, 0)));
                av_push(meta, newSVsv(*av_fetch(r, 2, 0)));
                av_push(meta, newSVsv(*av_fetch(r, 3, 0)));
                mPUSHs(newRV_noinc((SV *)meta));
            } else {
                mPUSHs(ks);
            }
        }
    }

SV *
near_stats(self)
        SV *self
    CODE:
    {
        NcStats s;
        HV *hv;
        CHECK(nc_stats(near_from_sv(aTHX_ self)->h, &s));
        hv = newHV();
#define NEAR_STAT(f) (void)hv_stores(hv, #f, newSVuv((UV)s.f))
        NEAR_STAT(hits); NEAR_STAT(misses); NEAR_STAT(sets); NEAR_STAT(deletes);
        NEAR_STAT(evictions); NEAR_STAT(expirations); NEAR_STAT(resets);
        NEAR_STAT(corruptions); NEAR_STAT(compactions); NEAR_STAT(items);
        NEAR_STAT(live_bytes); NEAR_STAT(used_bytes); NEAR_STAT(capacity_bytes);
        NEAR_STAT(shards); NEAR_STAT(file_bytes);
        NEAR_STAT(lock_timeouts); NEAR_STAT(salvages); NEAR_STAT(entries_lost);
        NEAR_STAT(held_bytes);
        NEAR_STAT(spilled_bytes); NEAR_STAT(spilled_values); NEAR_STAT(spill_refused);
        NEAR_STAT(max_compaction_bytes);
#undef NEAR_STAT
        RETVAL = newRV_noinc((SV *)hv);
    }
    OUTPUT:
        RETVAL

SV *
near_check(self)
        SV *self
    CODE:
    {
        NcCheckReport r;
        HV *hv;
        CHECK(nc_check(near_from_sv(aTHX_ self)->h, &r));
        hv = newHV();
        (void)hv_stores(hv, "shards", newSVuv((UV)r.shards));
        (void)hv_stores(hv, "entries", newSVuv((UV)r.entries));
        (void)hv_stores(hv, "live_bytes", newSVuv((UV)r.live_bytes));
        (void)hv_stores(hv, "repaired_shards", newSVuv((UV)r.repaired_shards));
        RETVAL = newRV_noinc((SV *)hv);
    }
    OUTPUT:
        RETVAL

UV
near_capacity(self)
        SV *self
    CODE:
        RETVAL = (UV)nc_capacity(near_from_sv(aTHX_ self)->h);
    OUTPUT:
        RETVAL

UV
near_shard_count(self)
        SV *self
    CODE:
        RETVAL = (UV)nc_shard_count(near_from_sv(aTHX_ self)->h);
    OUTPUT:
        RETVAL

UV
near_max_entry_size(self)
        SV *self
    CODE:
        RETVAL = (UV)nc_max_entry_size(near_from_sv(aTHX_ self)->h);
    OUTPUT:
        RETVAL

UV
near_max_value_size(self)
        SV *self
    CODE:
        RETVAL = (UV)nc_max_value_size(near_from_sv(aTHX_ self)->h);
    OUTPUT:
        RETVAL

UV
near_spill_threshold(self)
        SV *self
    CODE:
        RETVAL = (UV)nc_spill_threshold(near_from_sv(aTHX_ self)->h);
    OUTPUT:
        RETVAL

UV
near_max_key_length(...)
    CODE:
        RETVAL = (UV)nc_max_key_len();
    OUTPUT:
        RETVAL

SV *
near_default_directory(...)
    CODE:
    {
        near_slot slot = { NULL, 0 };
        NcStatus st = nc_default_directory(near_alloc, &slot);
        if (st != NC_OK) {
            if (slot.sv)
                SvREFCNT_dec(slot.sv);
            near_croak_status(aTHX_ st);
        }
        RETVAL = slot.sv ? slot.sv : newSV(0);
    }
    OUTPUT:
        RETVAL

void
near__debug_hold_shard_mid_write(self, key, hold_ms)
        SV *self
        SV *key
        UV hold_ms
    CODE:
    {
        near_t *n = near_from_sv(aTHX_ self);
        STRLEN klen;
        const char *k = near_key(aTHX_ key, &klen);
        if (!k)
            croak("Cache::Near: the key is too long");
        CHECK(nc_debug_hold_shard_mid_write(n->h, (const uint8_t *)k, klen, (uint64_t)hold_ms));
    }

void
near__debug_set_clock_ms(unix_ms)
        UV unix_ms
    CODE:
        nc_debug_set_clock_ms((uint64_t)unix_ms);

void
near__encode_native(self, value)
        SV *self
        SV *value
    PPCODE:
    {
        /* (flags, payload) of a plain scalar's native form; () for a reference. */
        near_t plain;
        near_encoded e;
        PERL_UNUSED_VAR(self);
        Zero(&plain, 1, near_t);
        if (near_encode_native(aTHX_ &plain, value, &e)) {
            EXTEND(SP, 2);
            mPUSHu(e.flags);
            mPUSHs(newSVpvn(e.ptr, e.len));
        }
    }

void
near__decode_native(self, flags, payload)
        SV *self
        UV flags
        SV *payload
    PPCODE:
    {
        /* (value) of a native payload; () if malformed. */
        STRLEN len;
        const char *p = SvPV(payload, len);
        SV *v;
        if (flags >= FLAG_USER)
            XSRETURN_EMPTY;
        v = near_decode(aTHX_ self, &PL_sv_undef, newSVpvn(p, len), (uint32_t)flags, 0);
        if (v)
            mXPUSHs(v);
    }
