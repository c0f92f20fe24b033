package Cache::Near;

# The Perl face of nearcache's engine. The hot paths (get, set, remove
# without callbacks) are XS (Near.xs); this file holds the policy:
# options, serializers, compression, signing, callbacks, and everything
# Cache::FastMmap documents, built from the engine's primitives.
#
# How Cache::FastMmap's features map onto the engine:
# - Atomic read-modify-write (get_and_set, get_and_remove, conditional
#   stores with a modseq): the engine's compare-and-swap. Read the entry
#   and its version, run the Perl code with no lock held, store only if
#   the version is unchanged, else run again on the newer value.
# - Write-back: a dirty entry carries FLAG_DIRTY and its own expiry time
#   in an 8-byte prefix, and is stored without an engine expiry, so that
#   empty(), expire() and empty_on_exit can still write it back after it
#   expired (the engine drops expired entries without telling anyone).
# - Tombstones (remove with a modseq): an entry with FLAG_TOMBSTONE whose
#   payload is the modseq; values stored with a modseq carry FLAG_MODSEQ
#   and an 8-byte prefix.
# These three flags use bits 16-18 of the flags word, which the Python
# package treats as reserved: it reads such entries as misses.
#
# Never is Perl code run while the engine holds a shard lock: the XS
# calls the engine, the engine returns, and only then are serializers and
# callbacks called.

use strict;
use warnings;
use Carp qw(croak);
use Scalar::Util qw(blessed weaken);

our $VERSION = '0.2.0';

require XSLoader;
XSLoader::load('Cache::Near', $VERSION);

# Whether the engine's compare-and-swap is built in (see _read_versioned).
my $HAVE_CAS = _have_cas();
sub HAVE_CAS { $HAVE_CAS }

# The flags word, shared with the Python package (nearcache.serializers):
# bits 0-3 native type, bit 4 "encoded", bits 5-6 compression, bit 7
# signed, bits 8-15 serializer id, bits 16-18 this module's FastMmap
# features (dirty, tombstone, modseq), bits 19-30 reserved, bit 31 the
# engine's own (spilled).
use constant {
    FLAG_BYTES        => 0,
    FLAG_STR          => 1,
    FLAG_INT          => 2,
    FLAG_FLOAT        => 3,
    FLAG_BOOL         => 4,
    FLAG_NONE         => 5,
    FLAG_USER         => 16,
    FLAG_SIGNED       => 1 << 7,
    FLAG_DIRTY        => 1 << 16,
    FLAG_TOMBSTONE    => 1 << 17,
    FLAG_MODSEQ       => 1 << 18,
    FASTMMAP_MASK     => (1 << 16) | (1 << 17) | (1 << 18),
    COMPRESSION_SHIFT => 5,
    SERIALIZER_SHIFT  => 8,
    NATIVE_MASK       => 0x0F,
    RESERVED_MASK     => 0xFFF8_0000,
    SIGNATURE_SIZE    => 32,
};

# Compression ids (bits 5-6): 1 is the Python package's zstd; 2 is zlib;
# 3 is a Perl compressor named by the payload's first byte (COMPRESSOR_TAG).
use constant { COMPRESSION_ZLIB => 2, COMPRESSION_TAGGED => 3 };
my %COMPRESSOR_TAG = (lz4 => 'l', snappy => 's', custom => 'c');

# Serializer ids (bits 8-15): 2 is JSON in both languages; 16, 17 and 18
# are Perl's Storable, Sereal and a custom [\&freeze, \&thaw] pair (the
# Python package rejects them as foreign).
my %SERIALIZERS = (
    json     => { id => 2,  build => \&_json_codec },
    storable => { id => 16, build => \&_storable_codec },
    sereal   => { id => 17, build => \&_sereal_codec },
);
use constant SERIALIZER_CUSTOM => 18;

my %SET_MODE = (set => 0, add => 1, replace => 2);

my %KNOWN_OPTION = map { $_ => 1 } qw(
    share_file cache_size shards expire_time raw_values serializer compress compressor
    compress_threshold signing_key read_cb write_cb delete_cb write_action
    cache_not_found context init_file unlink_on_exit create recreate
    allow_foreign_owner lock_timeout spill_threshold spill_budget fs_reserve
    page_size num_pages enable_stats allow_recursive empty_on_exit catch_deadlocks
    tombstone_expire_time permissions start_slots
);

my %SIZE_UNIT = (k => 1 << 10, m => 1 << 20, g => 1 << 30);
my %TIME_UNIT = (s => 1, m => 60, h => 3600, d => 86400, w => 604800);

# Caches with empty_on_exit, emptied at exit if still alive (weak refs).
our %LiveCaches;

END { _cleanup($_) for grep { defined } values %LiveCaches }

sub new {
    my ($class, @args) = @_;
    my %opt = @args == 1 && ref $args[0] eq 'HASH' ? %{ $args[0] } : @args;
    croak 'Cache::Near->new: options must be key => value pairs or a hash reference' if @args % 2 && @args != 1;
    my @unknown = grep { !$KNOWN_OPTION{$_} } sort keys %opt;
    croak "Cache::Near->new: unknown option(s): @unknown" if @unknown;

    my $path = $opt{share_file};
    croak 'Cache::Near->new: share_file must be a file name, not a reference' if ref $path;
    my $default_file = !defined $path || $path eq '';
    if ($default_file) {
        $path = sprintf '%s/perl-%d-%d-%d', Cache::Near->default_directory, $$, time, int rand 1e9;
    }
    my $existed = -e $path;

    my ($size, $page_size, $num_pages) = _sizes(\%opt);
    # An existing file opened without any size is taken as it is.
    $size = 0 if $existed && !grep { defined $opt{$_} } qw(cache_size page_size num_pages);
    my $shards = defined $opt{shards} ? $opt{shards} : 0;
    croak "Cache::Near->new: shards must be 0 (auto) or a power of two up to 65536, got '$shards'"
        unless $shards =~ /\A[0-9]+\z/ && $shards <= 65536 && ($shards & ($shards - 1)) == 0;

    my $default_ttl_ms = _parse_expire(defined $opt{expire_time} ? $opt{expire_time} : 0, 'expire_time');
    my $write_action = defined $opt{write_action} ? $opt{write_action} : 'write_through';
    croak "Cache::Near->new: write_action must be 'write_through' or 'write_back', got '$write_action'"
        unless $write_action eq 'write_through' || $write_action eq 'write_back';

    my %self = (
        share_file         => $path,
        cache_size         => $size,
        page_size          => $page_size,
        num_pages          => $num_pages,
        compress_threshold => _parse_size(defined $opt{compress_threshold} ? $opt{compress_threshold} : 1024),
        cache_not_found    => $opt{cache_not_found} ? 1 : 0,
        context            => $opt{context},
        expire_time        => $default_ttl_ms / 1000,
        write_back         => $write_action eq 'write_back' ? 1 : 0,
        allow_recursive    => $opt{allow_recursive} ? 1 : 0,
        enable_stats       => $opt{enable_stats} ? 1 : 0,
        empty_on_exit      => $opt{empty_on_exit} ? 1 : 0,
        catch_deadlocks    => $opt{catch_deadlocks} ? 1 : 0,
        pid                => $$,
        _stats_base        => [ 0, 0 ],
    );
    if (defined $opt{tombstone_expire_time}) {
        $self{tombstone_expire_time} = _parse_expire($opt{tombstone_expire_time}, 'tombstone_expire_time') / 1000;
        $self{_tombstones} = 1;
    }
    for my $cb (qw(read_cb write_cb delete_cb)) {
        next unless defined $opt{$cb};
        croak "Cache::Near->new: $cb must be a code reference" unless ref $opt{$cb} eq 'CODE';
        $self{$cb} = $opt{$cb};
    }

    _configure_serializer(\%self, \%opt);
    _configure_compressor(\%self, \%opt);
    if (defined $opt{signing_key}) {
        croak 'Cache::Near->new: signing_key must be a string' if ref $opt{signing_key};
        require Digest::SHA;
        my $key = $opt{signing_key};
        utf8::encode($key) if utf8::is_utf8($key);
        croak 'Cache::Near->new: signing_key must be at least 16 bytes (as in the Python package)'
            if length $key < 16;
        $self{signing_key} = $key;
    }

    # FastMmap's default: remove the file at exit if this object created it.
    $self{unlink_on_exit} = (defined $opt{unlink_on_exit} ? $opt{unlink_on_exit} : !$existed) ? 1 : 0;
    my $permissions = defined $opt{permissions} ? $opt{permissions} : 0640;
    croak "Cache::Near->new: permissions must be a file mode such as 0640, got '$permissions'"
        unless $permissions =~ /\A[0-9]+\z/ && $permissions <= 07777 && ($permissions & 0600) == 0600;
    $self{permissions} = $permissions;
    # A file others may write is a file shared on purpose: accept it.
    my $foreign = $opt{allow_foreign_owner} || ($permissions & 022) ? 1 : 0;

    my $lock_timeout_ms = 0;    # 0: the engine's default (50 ms)
    if (defined $opt{lock_timeout}) {
        croak 'Cache::Near->new: lock_timeout must be a positive number of seconds'
            unless !ref $opt{lock_timeout}
            && $opt{lock_timeout} =~ /\A(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\z/
            && $opt{lock_timeout} > 0;
        $lock_timeout_ms = int($opt{lock_timeout} * 1000 + 0.5) || 1;
    }
    # Large values (see "LARGE VALUES" in the POD); 0 takes the engine's
    # defaults (128 KiB, 1 GiB), and a budget of 0 turns spilling off.
    my ($spill_threshold, $spill_budget, $no_spill) = (0, 0, 0);
    if (defined $opt{spill_threshold}) {
        $spill_threshold = _parse_size($opt{spill_threshold});
        croak "Cache::Near->new: spill_threshold must be at least 1 byte, got '$opt{spill_threshold}'"
            unless $spill_threshold > 0;
    }
    if (defined $opt{spill_budget}) {
        $spill_budget = _parse_size($opt{spill_budget});
        $no_spill = $spill_budget == 0 ? 1 : 0;
    }
    # The file system's share the cache leaves free (see "fs_reserve" in the
    # POD); 0 takes the engine's default, and a reserve of 0 turns it off.
    my ($fs_reserve, $no_fs_reserve) = (0, 0);
    if (defined $opt{fs_reserve}) {
        $fs_reserve = _parse_size($opt{fs_reserve});
        $no_fs_reserve = $fs_reserve == 0 ? 1 : 0;
    }
    my $cache = eval {
        $class->_open(
            $path, $size, $shards,
            (exists $opt{create} ? ($opt{create} ? 1 : 0) : 1),
            ($opt{recreate} || $opt{init_file} ? 1 : 0),
            $foreign, $lock_timeout_ms, $spill_threshold, $spill_budget, $no_spill,
            $fs_reserve, $no_fs_reserve,
            $default_ttl_ms, _hooked(\%self), _perl_encode(\%self),
            (defined $self{signing_key} ? 1 : 0), \%self,
        );
    };
    croak _incompatible("$@", \%opt) if !$cache && $@ =~ /incompatible cache file/;
    die $@ unless $cache;
    chmod $permissions, $path if !$existed && (stat $path)[4] == $>;
    $cache->_clear if $opt{init_file};
    weaken($LiveCaches{"$cache"} = $cache) if $self{empty_on_exit};
    return $cache;
}

# get/set/remove go through Perl when FastMmap's callbacks, write-back or
# tombstones need it; otherwise the XS does them alone.
sub _hooked {
    my ($o) = @_;
    return (grep { $o->{$_} } qw(read_cb write_cb delete_cb write_back _tombstones)) ? 1 : 0;
}

# Every value goes through _encode when compressing, signing or with a
# custom serializer (which FastMmap applies to plain scalars too).
sub _perl_encode {
    my ($o) = @_;
    return ($o->{compress} || defined $o->{signing_key} || $o->{custom_serializer}) ? 1 : 0;
}

sub _opts { $_[0] }

sub DESTROY {
    my ($self) = @_;
    _cleanup($self);
}

sub _cleanup {
    my ($self) = @_;
    return if $self->{_cleaned}++;
    delete $LiveCaches{"$self"};
    my $mine = $self->_owner_pid == $$ && $self->{pid} == $$;
    if ($mine && $self->{empty_on_exit} && !$self->is_closed) {
        local $@;
        eval { $self->empty; 1 } or warn "Cache::Near: empty_on_exit failed: $@";
    }
    $self->_free;
    return unless $mine && $self->{unlink_on_exit};
    unlink $self->{share_file};
    _remove_spill_dir($self->{share_file});
}

# Remove the directory of spilled values beside a cache file: the files
# the engine names (16 hex digits, or ".tmp-" and 16 hex digits for a
# write that was interrupted), then the directory if that emptied it.
# Nothing else in it is touched, and a symlink is not followed.
sub _remove_spill_dir {
    my ($file) = @_;
    my $dir = "$file.spill";
    return if -l $dir || !-d _;
    opendir my $dh, $dir or return;
    my @names = grep { /\A(?:\.tmp-)?[0-9a-f]{16}\z/ } readdir $dh;
    closedir $dh;
    unlink map { "$dir/$_" } @names;
    rmdir $dir;
    return;
}

# A cache object holds a C pointer: threads started with ithreads do not
# get copies (they open their own).
sub CLONE_SKIP { 1 }

# ---------------------------------------------------------------- options

sub share_file  { $_[0]->{share_file} }
sub expire_time { $_[0]->{expire_time} }
sub raw_values  { $_[0]->{raw_values} }
sub serializer  { $_[0]->{serializer} }

# A file the engine cannot read (another version of nearcache wrote it;
# another size is resized, not refused), told in this module's options.
sub _incompatible {
    my ($err, $opt) = @_;
    $err =~ s/ at \S+ line \d+\.?\n?\z//;
    my @asked = map { "$_ => '$opt->{$_}'" } grep { defined $opt->{$_} } qw(cache_size page_size num_pages);
    my $asked = @asked ? ' (opened with ' . join(', ', @asked) . ')' : '';
    my $size = @asked ? '' : ' and a cache_size';
    return "$err$asked: the file was written by another version of nearcache, which may "
        . "still be running: pass recreate => 1$size to replace it with an empty file, or "
        . "delete it once no process of that version uses it";
}

# Cache::FastMmap's sizing: cache_size alone, or page_size x num_pages
# (defaults 64k x 89), each page a power of two of at least 4k. The
# engine's shards are its own; the total is what is kept.
sub _sizes {
    my ($opt) = @_;
    my ($pages, $page) = @$opt{qw(num_pages page_size)};
    for ([ num_pages => $pages ], [ page_size => $page ]) {
        my ($name, $v) = @$_;
        croak "Cache::Near->new: $name must be a positive number, got '$v'"
            if defined $v && !(defined eval { _parse_size($v) } && _parse_size($v) > 0);
    }
    $page = _parse_size($page) if defined $page;
    if (defined $opt->{cache_size}) {
        my $size = _parse_size($opt->{cache_size});
        croak "Cache::Near->new: cache_size must be positive, got '$opt->{cache_size}'" unless $size > 0;
        $pages ||= int($size / ($page || 65536)) || 1;
        $page  ||= _pow2(int($size / $pages));
        return ($size, $page, $pages);
    }
    return (64 << 20, 65536, int((64 << 20) / 65536)) unless defined $pages || defined $page;
    $pages ||= 89;
    $page = _pow2($page || 65536);
    $page = 4096 if $page < 4096;
    my $size = $pages * $page;
    # The engine's smallest file; FastMmap's smallest caches round up to it.
    $size = MIN_SIZE() if $size < MIN_SIZE();
    return ($size, $page, $pages);
}

use constant MIN_SIZE => 20480;

sub _pow2 { my ($n) = @_; return $n < 1 ? 1 : int(2**int(log($n) / log(2)) + 0.1) }

sub _parse_size {
    my ($size) = @_;
    croak "Cache::Near: size '" . (defined $size ? $size : 'undef')
        . "' is not a number of bytes (optionally with k, m or g)"
        unless defined $size && !ref $size && $size =~ /\A\s*([0-9]+)\s*([kmg]?)b?\s*\z/i;
    return $1 * ($2 ? $SIZE_UNIT{ lc $2 } : 1);
}

# Milliseconds of a relative expiry, as Cache::FastMmap reads it: seconds,
# or a number and a unit (s, m, h, d or w, or a word starting with one:
# '10m', '1 minute', '2 hours'); 'never' is 0 (never expires); 'now' is -1
# (expired at once). Anything else croaks (FastMmap would take it as 0).
sub _parse_expire {
    my ($spec, $what) = @_;
    $what ||= 'expire time';
    croak "Cache::Near: the $what is undefined" unless defined $spec;
    return 0 if $spec =~ /\A\s*never\s*\z/i;
    return -1 if $spec =~ /\A\s*now\s*\z/i;
    croak "Cache::Near: $what '$spec' is not seconds, a number with a unit (s, m, h, d, w: '10m', '2 hours'), 'now' or 'never'"
        unless !ref $spec
        && $spec =~ /\A\s*([0-9]+(?:\.[0-9]*)?)\s*(?:([smhdw])[a-z]*)?\s*\z/i;
    return int($1 * ($2 ? $TIME_UNIT{ lc $2 } : 1) * 1000 + 0.5);
}

# Called by the XS for an expire argument that is not a plain integer.
sub _expire_ms {
    my ($self, $spec) = @_;
    my $ms = _parse_expire($spec);
    croak "Cache::Near: expire time '$spec' ('now') needs the set options of Cache::Near; use remove"
        if $ms < 0;
    return $ms;
}

sub _configure_serializer {
    my ($self, $opt) = @_;
    my $ser = $opt->{serializer};
    if (!defined $ser) {
        $ser = $opt->{raw_values} ? '' : 'storable';
    } elsif ($opt->{raw_values} && $ser ne '' && !ref $ser && lc $ser ne 'raw') {
        croak "Cache::Near->new: raw_values and serializer '$ser' exclude each other";
    }
    if (ref $ser eq 'ARRAY') {
        croak 'Cache::Near->new: a custom serializer is [ \&serialize, \&deserialize ]'
            unless @$ser == 2 && ref $ser->[0] eq 'CODE' && ref $ser->[1] eq 'CODE';
        my ($s, $d) = @$ser;
        # FastMmap's convention: serialize gets \$value, deserialize returns \$value.
        @$self{qw(freeze thaw)} = (sub { $s->(\$_[0]) }, sub { my $r = $d->($_[0]); ref $r ? $$r : $r });
        @$self{qw(serializer serializer_id custom_serializer)} = ('custom', SERIALIZER_CUSTOM, 1);
        return;
    }
    croak "Cache::Near->new: serializer must be '', a name or [ \\&serialize, \\&deserialize ]" if ref $ser;
    if ($ser eq '' || lc $ser eq 'raw') {
        @$self{qw(raw_values serializer)} = (1, '');
        return;
    }
    my $spec = $SERIALIZERS{ lc $ser }
        or croak "Cache::Near->new: unknown serializer '$ser' (known: '', "
        . join(', ', sort keys %SERIALIZERS) . ', or [ \&serialize, \&deserialize ])';
    @$self{qw(freeze thaw)} = $spec->{build}->();
    $self->{serializer} = lc $ser;
    $self->{serializer_id} = $spec->{id};
    $self->{raw_values} = 0;
}

sub _configure_compressor {
    my ($self, $opt) = @_;
    my $c = $opt->{compressor};
    $c = $opt->{compress} ? 'zlib' : undef if !defined $c;
    return unless $c;
    if (ref $c eq 'ARRAY') {
        croak 'Cache::Near->new: a custom compressor is [ \&compress, \&uncompress ]'
            unless @$c == 2 && ref $c->[0] eq 'CODE' && ref $c->[1] eq 'CODE';
        @$self{qw(compress compress_fn uncompress_fn)} = ('custom', @$c);
        return;
    }
    my %module = (zlib => 'Compress::Zlib', lz4 => 'Compress::LZ4', snappy => 'Compress::Snappy');
    my $module = $module{ lc $c } or croak "Cache::Near->new: unknown compressor '$c' (known: lz4, snappy, zlib, or [ \\&compress, \\&uncompress ])";
    eval "require $module; 1" or croak "Cache::Near->new: compressor '$c' needs $module: $@";
    $self->{compress} = lc $c;
    if (lc $c ne 'zlib') {
        @$self{qw(compress_fn uncompress_fn)} = ($module->can('compress'), $module->can('uncompress'));
    }
}

sub _storable_codec {
    require Storable;
    return (sub { Storable::nfreeze(\$_[0]) }, sub { ${ Storable::thaw($_[0]) } });
}

sub _sereal_codec {
    require Sereal::Encoder;
    require Sereal::Decoder;
    my $enc = Sereal::Encoder->new;
    my $dec = Sereal::Decoder->new;
    return (sub { $enc->encode($_[0]) }, sub { $dec->decode($_[0]) });
}

sub _json_codec {
    my $class = eval { require Cpanel::JSON::XS; 'Cpanel::JSON::XS' } || do { require JSON::PP; 'JSON::PP' };
    my $json = $class->new->utf8->canonical->allow_nonref;
    return (sub { $json->encode($_[0]) }, sub { $json->decode($_[0]) });
}

# ---------------------------------------------------------------- clock

# The time this process's clock is held at, in ms (_set_time_override);
# 0: the real clock.
my $CLOCK_MS = 0;

sub _now_ms {
    return $CLOCK_MS if $CLOCK_MS;
    require Time::HiRes;
    return int(Time::HiRes::time() * 1000);
}

# Cache::FastMmap's test hook: hold this process's clock at $time (Unix
# seconds) from now on, or let it run again without an argument. Holds
# the engine's clock too, so expiry follows.
sub _set_time_override {
    my ($time) = @_;
    $CLOCK_MS = $time ? int($time * 1000) : 0;
    _debug_set_clock_ms($CLOCK_MS);
    return;
}

# ---------------------------------------------------------------- values

sub _key_bytes {
    my ($key) = @_;
    my $bytes = "$key";
    utf8::upgrade($bytes);
    utf8::encode($bytes);
    return $bytes;
}

sub _tag {
    my ($secret, $flags, $key, $body) = @_;
    my $k = _key_bytes($key);
    return Digest::SHA::hmac_sha256(pack('VV', $flags, length $k) . $k . $body, $secret);
}

sub _compress_body {
    my ($o, $body) = @_;
    return ($body, 0) unless $o->{compress} && length $body >= $o->{compress_threshold};
    if ($o->{compress} eq 'zlib') {
        my $packed = Compress::Zlib::compress($body);
        return length $packed < length $body ? ($packed, COMPRESSION_ZLIB) : ($body, 0);
    }
    my $packed = $COMPRESSOR_TAG{ $o->{compress} eq 'custom' ? 'custom' : $o->{compress} } . $o->{compress_fn}->($body);
    return length $packed < length $body ? ($packed, COMPRESSION_TAGGED) : ($body, 0);
}

sub _uncompress_body {
    my ($o, $compression, $body) = @_;
    if ($compression == COMPRESSION_ZLIB) {
        require Compress::Zlib;
        return Compress::Zlib::uncompress($body);
    }
    return undef unless $compression == COMPRESSION_TAGGED && length $body;
    my $tag = substr $body, 0, 1;
    my $name = $o->{compress} || '';
    my $fn = $o->{uncompress_fn};
    if ($tag ne $COMPRESSOR_TAG{ $name eq 'custom' ? 'custom' : $name } || !$fn) {
        # Another process's compressor: lz4 and snappy can be loaded by name.
        my %module = (l => 'Compress::LZ4', s => 'Compress::Snappy');
        my $module = $module{$tag} or return undef;
        eval "require $module; 1" or return undef;
        $fn = $module->can('uncompress');
    }
    return $fn->(substr $body, 1);
}

# (flags, payload) of a value: the native form of a plain scalar, else
# the serializer's; then compression and signing as configured.
sub _encode {
    my ($self, $value, $key) = @_;
    my $o = $self;
    my ($flags, $body, $serializer_id) = (undef, undef, 0);
    if ($o->{custom_serializer}) {
        $body = $o->{freeze}->($value);
        ($flags, $serializer_id) = (0, SERIALIZER_CUSTOM);
    } else {
        if ($o->{raw_values} && ref $value) {
            # FastMmap without a serializer stores what a reference stringifies to.
            $value = "$value";
        }
        ($flags, $body) = $self->_encode_native($value);
        if (!defined $flags) {
            $body = eval { $o->{freeze}->($value) };
            croak "Cache::Near: the $o->{serializer} serializer cannot encode the value: $@" unless defined $body;
            ($flags, $serializer_id) = (0, $o->{serializer_id});
        }
    }
    utf8::encode($body) if utf8::is_utf8($body) && $serializer_id;
    my $compression;
    ($body, $compression) = _compress_body($o, $body);
    my $signing_key = $o->{signing_key};
    return ($flags, $body) if !$serializer_id && !$compression && !defined $signing_key;
    $flags |= FLAG_USER | ($compression << COMPRESSION_SHIFT) | ($serializer_id << SERIALIZER_SHIFT);
    if (defined $signing_key) {
        $flags |= FLAG_SIGNED;
        $body = _tag($signing_key, $flags, $key, $body) . $body;
    }
    return ($flags, $body);
}

# The FastMmap envelope of a stored entry: bits 16-18 and their 8-byte
# prefixes peeled off. Returns (flags left, body, \%meta) with meta keys
# dirty, expire_on_ms (dirty entries), modseq, tombstone.
sub _unwrap {
    my ($flags, $payload) = @_;
    my %meta;
    return ($flags, $payload, \%meta) unless $flags & FASTMMAP_MASK;
    if ($flags & FLAG_DIRTY) {
        return unless length $payload >= 8;
        $meta{dirty} = 1;
        $meta{expire_on_ms} = unpack 'Q<', substr($payload, 0, 8);
        $payload = substr $payload, 8;
    }
    if ($flags & (FLAG_TOMBSTONE | FLAG_MODSEQ)) {
        return unless length $payload >= 8;
        $meta{modseq} = unpack 'Q<', substr($payload, 0, 8);
        $meta{tombstone} = 1 if $flags & FLAG_TOMBSTONE;
        $payload = substr $payload, 8;
    }
    return ($flags & ~FASTMMAP_MASK, $payload, \%meta);
}

sub _wrap {
    my ($flags, $body, $meta) = @_;
    if (defined $meta->{modseq}) {
        $flags |= $meta->{tombstone} ? FLAG_TOMBSTONE : FLAG_MODSEQ;
        $body = pack('Q<', $meta->{modseq}) . $body;
    }
    if ($meta->{dirty}) {
        $flags |= FLAG_DIRTY;
        $body = pack('Q<', $meta->{expire_on_ms} || 0) . $body;
    }
    return ($flags, $body);
}

# Whether an unwrapped entry is to be a miss: a tombstone, or a dirty
# entry past its own expiry.
sub _dead {
    my ($meta) = @_;
    return 1 if $meta->{tombstone};
    return 1 if $meta->{dirty} && $meta->{expire_on_ms} && $meta->{expire_on_ms} <= _now_ms();
    return 0;
}

# The value of a stored (flags, payload), or () to treat it as a miss
# (unknown flags, bad signature, foreign serializer or compression, a
# tombstone or an expired dirty entry). Called by the XS for flags >= 16.
sub _decode {
    my ($self, $flags, $payload, $key) = @_;
    my ($f, $body, $meta) = _unwrap($flags, $payload);
    return if !defined $f || _dead($meta);
    return $self->_decode_body($f, $body, $key);
}

sub _decode_body {
    my ($self, $flags, $payload, $key) = @_;
    my $o = $self;
    my $signing_key = $o->{signing_key};
    if ($flags < FLAG_USER) {
        return if defined $signing_key;
        return $self->_decode_native($flags, $payload);
    }
    return if $flags & RESERVED_MASK;
    my $body = $payload;
    if ($flags & FLAG_SIGNED) {
        return if length $payload < SIGNATURE_SIZE;
        $body = substr $payload, SIGNATURE_SIZE;
        return if defined $signing_key
            && !_equal_tags(substr($payload, 0, SIGNATURE_SIZE), _tag($signing_key, $flags, $key, $body));
    } elsif (defined $signing_key) {
        return;
    }
    my $compression = ($flags >> COMPRESSION_SHIFT) & 3;
    if ($compression) {
        $body = _uncompress_body($o, $compression, $body);
        return unless defined $body;
    }
    my $serializer_id = ($flags >> SERIALIZER_SHIFT) & 0xFF;
    return $self->_decode_native($flags & NATIVE_MASK, $body) unless $serializer_id;
    return if $flags & NATIVE_MASK;
    return if $o->{raw_values} || !$o->{serializer_id} || $serializer_id != $o->{serializer_id};
    # A custom deserializer's exception is the caller's to see (FastMmap
    # propagates it); the named ones' failures are misses.
    return ($o->{thaw}->($body)) if $o->{custom_serializer};
    my @value = eval { ($o->{thaw}->($body)) };
    return @value == 1 ? $value[0] : ();
}

sub _equal_tags {
    my ($x, $y) = @_;
    return 0 unless length $x == length $y;
    my $diff = 0;
    $diff |= ord(substr $x, $_, 1) ^ ord(substr $y, $_, 1) for 0 .. length($x) - 1;
    return $diff == 0;
}

# ---------------------------------------------------------------- versions

# The engine's compare-and-swap (Cache::Near::_have_cas). Before it, a
# fallback by value: the "version" is the stored bytes, and a swap is a
# compare-and-delete then an add (not atomic for readers: they can see
# a miss in between).
sub _read_versioned {
    my ($self, $key) = @_;
    return $self->_get_versioned($key) if HAVE_CAS();
    my ($flags, $payload) = $self->_raw_get($key);
    return unless defined $flags;
    return ($flags, $payload, [ $flags, $payload ]);
}

sub _swap {
    my ($self, $key, $flags, $payload, $ttl_ms, $version) = @_;
    return ($self->_cas($key, $flags, $payload, $ttl_ms, $version || 0))[0] if HAVE_CAS();
    if ($version) {
        return 0 unless $self->_delete_if_equals($key, $version->[1]);
    }
    return $self->_store_raw($key, $flags, $payload, $ttl_ms, $SET_MODE{add});
}

sub _remove_version {
    my ($self, $key, $version) = @_;
    return $self->_delete_if_version($key, $version) if HAVE_CAS();
    return $self->_delete_if_equals($key, $version->[1]);
}


# ---------------------------------------------------------------- expiry of one write

# (engine ttl ms, absolute expire_on ms or 0 for never, or expire_on -1
# for "already expired") of set's options: a hashref with expire_on
# (Unix seconds) or expire_time (relative), or a plain expire time.
sub _expiry_of {
    my ($self, $opts) = @_;
    my $now = _now_ms();
    my $ms;
    if (ref $opts eq 'HASH') {
        if (defined $opts->{expire_on}) {
            my $on = $opts->{expire_on};
            croak "Cache::Near: expire_on '$on' is not a Unix time in seconds"
                unless !ref $on && $on =~ /\A[0-9]+(?:\.[0-9]*)?\z/;
            return (0, 0) if $on == 0;
            my $at = int($on * 1000);
            return $at <= $now ? (-1, -1) : ($at - $now, $at);
        }
        $ms = defined $opts->{expire_time} ? _parse_expire($opts->{expire_time}) : undef;
    } elsif (defined $opts) {
        croak "Cache::Near: set options must be a hash reference or an expire time" if ref $opts;
        $ms = _parse_expire($opts);
    }
    $ms = $self->{expire_time} * 1000 unless defined $ms;
    return (-1, -1) if $ms < 0;
    return (0, 0) if $ms == 0;
    return ($ms, $now + $ms);
}

# ---------------------------------------------------------------- callbacks

sub _cb_context { my ($self) = @_; my $c = $self->{context}; return defined $c ? $c : $self }

# FastMmap holds a page lock while a callback runs, so a callback that
# calls back into the cache dies unless allow_recursive is set. Nothing
# is locked here, but the rule is kept: re-entry is refused the same way.
sub _enter {
    my ($self, $what) = @_;
    croak "Cache::Near: $what called from a callback: the cache is already locked (set allow_recursive => 1 to allow it)"
        if $self->{_in_callback} && !$self->{allow_recursive};
}

sub _call_cb {
    my ($self, $name, @args) = @_;
    my $cb = $self->{$name} or return;
    local $self->{_in_callback} = 1;
    return $cb->($self->_cb_context, @args);
}

# ---------------------------------------------------------------- get

# get($key, \%opts) through Perl: callbacks, write-back, tombstones, or
# the modseq option.
sub _get_full {
    my ($self, $key, $opts) = @_;
    croak 'Cache::Near: get options must be a hash reference' if defined $opts && ref $opts ne 'HASH';
    $self->_enter('get');
    my $modseq_out = $opts && $opts->{modseq};
    croak 'Cache::Near: the get option modseq must be a scalar reference'
        if defined $modseq_out && ref $modseq_out ne 'SCALAR';
    my ($found, $value, $meta) = $self->_lookup($key);
    if ($found) {
        $$modseq_out = $meta->{modseq} if $modseq_out;
        return $value;
    }
    $$modseq_out = undef if $modseq_out;
    return undef unless $self->{read_cb};
    my $tombstoned = $meta && $meta->{tombstone};
    my @read = $self->_call_cb('read_cb', $key);
    # A read_cb may return (value, { expire_on | expire_time }); any other
    # list counts by its last element, as FastMmap's scalar-context call.
    my ($v, $ropts) = @read == 2 && ref $read[1] eq 'HASH' && keys %{ $read[1] }
        && !grep({ $_ ne 'expire_on' && $_ ne 'expire_time' } keys %{ $read[1] }) ? @read : ($read[-1], undef);
    if ((defined $v || $self->{cache_not_found}) && !$tombstoned) {
        $self->_write($key, $v, (ref $ropts eq 'HASH' ? $ropts : undef), { clean => 1 });
    }
    return $v;
}

# (found, value, meta) of a key, () or (0, undef, meta) on a miss (meta
# of a tombstone or expired dirty entry when that is what is there).
sub _lookup {
    my ($self, $key) = @_;
    my ($flags, $payload) = $self->_raw_get($key);
    return (0) unless defined $flags;
    my ($f, $body, $meta) = _unwrap($flags, $payload);
    return (0) unless defined $f;
    return (0, undef, $meta) if _dead($meta);
    my @v = $self->_decode_stored($key, $f, $body);
    return (0, undef, $meta) unless @v;
    return (1, $v[0], $meta);
}

sub exists {
    my ($self, $key) = @_;
    my $flags = $self->_exists_flags($key);
    return 0 unless defined $flags;
    return 1 unless $flags & FASTMMAP_MASK;
    my ($found) = $self->_lookup($key);
    return $found ? 1 : 0;
}

# ---------------------------------------------------------------- set

# set($key, $value, $opts) through Perl: write-back, tombstones, an
# options hash (expire_on, expire_time, modseq), callbacks.
sub _set_full {
    my ($self, $key, $value, $opts) = @_;
    $self->_enter('set');
    my $stored = $self->_write($key, $value, $opts, {});
    my (undef, $on) = $self->_expiry_of($opts);
    # Write-through calls write_cb on every set; write-back only when the
    # value could not be kept in the cache (then the store must have it).
    if ($self->{write_cb} && $stored >= 0 && (!$self->{write_back} || !$stored)) {
        local $@;
        eval { $self->_call_cb('write_cb', $key, $value, $on > 0 ? $on / 1000 : $on); 1 };
    }
    return $stored > 0 ? 1 : 0;
}

# Store one value as FastMmap would: returns 1 if stored, 0 if not kept,
# -1 if refused (a tombstone or newer modseq). $how: clean => 1 for a
# value read from the backing store (never dirty).
sub _write {
    my ($self, $key, $value, $opts, $how) = @_;
    croak 'Cache::Near: set options must be a hash reference or an expire time'
        if ref $opts && ref $opts ne 'HASH';
    my $modseq = ref $opts eq 'HASH' ? $opts->{modseq} : undef;
    croak "Cache::Near: the set option modseq must be an unsigned integer, got '$modseq'"
        if defined $modseq && !(!ref $modseq && $modseq =~ /\A[0-9]+\z/ && $modseq <= 18446744073709551615);
    $self->_tombstones_on if defined $modseq;
    my ($ttl, $on) = $self->_expiry_of($opts);
    if ($ttl < 0) {
        # Already expired ('now', or an expire_on in the past): nothing is
        # kept, and what was there goes (a dirty value is written back).
        $self->expire($key);
        return 1;
    }
    my $dirty = $self->{write_back} && !$how->{clean};
    my ($flags, $payload) = $self->_encode_value($key, $value);
    my %meta = (modseq => $modseq);
    if ($dirty) {
        @meta{qw(dirty expire_on_ms)} = (1, $on);
        $ttl = 0;
    }
    ($flags, $payload) = _wrap($flags, $payload, \%meta);
    if (!$self->{_tombstones}) {
        return $self->_store_raw($key, $flags, $payload, $ttl, $SET_MODE{set}) ? 1 : 0;
    }
    # Conditional store: refused by a tombstone (unless the modseq is at
    # least its own) or by a live value with a newer modseq.
    for (;;) {
        my ($of, $op, $version) = $self->_read_versioned($key);
        if (defined $of) {
            my (undef, undef, $ometa) = _unwrap($of, $op);
            if ($ometa && defined $ometa->{modseq} && !_dead_expired_dirty($ometa)) {
                return -1 if $ometa->{tombstone} && (!defined $modseq || $modseq < $ometa->{modseq});
                return -1 if !$ometa->{tombstone} && defined $modseq && $modseq < $ometa->{modseq};
            }
        }
        return 1 if $self->_swap($key, $flags, $payload, $ttl, $version);
    }
}

sub _dead_expired_dirty {
    my ($meta) = @_;
    return $meta->{dirty} && $meta->{expire_on_ms} && $meta->{expire_on_ms} <= _now_ms();
}

# From now on this object checks for tombstones on every write (set and
# read_cb's stores go through Perl).
sub _tombstones_on {
    my ($self) = @_;
    return if $self->{_tombstones};
    $self->{_tombstones} = 1;
    $self->_set_mode(1, _perl_encode($self));
}

# ---------------------------------------------------------------- remove

sub _remove_full {
    my ($self, $key, $opts) = @_;
    croak 'Cache::Near: remove options must be a hash reference' if defined $opts && ref $opts ne 'HASH';
    $self->_enter('remove');
    my $modseq = $opts ? $opts->{modseq} : undef;
    my ($deleted, $was_dirty) = (0, 0);
    if (defined $modseq) {
        croak "Cache::Near: the remove option modseq must be an unsigned integer, got '$modseq'"
            unless !ref $modseq && $modseq =~ /\A[0-9]+\z/;
        $self->_tombstones_on;
        my %o = %$opts;
        if (!defined $o{expire_on} && !defined $o{expire_time} && $self->{tombstone_expire_time}) {
            $o{expire_time} = $self->{tombstone_expire_time};
        }
        my ($ttl) = $self->_expiry_of(\%o);
        for (;;) {
            my ($of, $op, $version) = $self->_read_versioned($key);
            my $keep = $modseq;
            if (defined $of) {
                my (undef, undef, $ometa) = _unwrap($of, $op);
                # A tombstone never has its modseq lowered.
                $keep = $ometa->{modseq}
                    if $ometa && $ometa->{tombstone} && defined $ometa->{modseq} && $ometa->{modseq} > $modseq;
                $was_dirty = $ometa && $ometa->{dirty} ? 1 : 0;
            }
            last if $ttl < 0 ? (defined $of ? $self->_remove_version($key, $version) : 1)
                : $self->_swap($key, _wrap(FLAG_NONE, '', { modseq => $keep, tombstone => 1 }), $ttl, $version);
        }
        $deleted = 1;
    } else {
        my ($flags, $payload) = $self->_pop_raw($key);
        if (defined $flags) {
            my (undef, undef, $meta) = _unwrap($flags, $payload);
            $deleted = 1;
            $was_dirty = $meta && $meta->{dirty} ? 1 : 0;
        }
    }
    # FastMmap: the backing store forgets the key unless the cache held
    # the only (dirty, never written) copy.
    if ($self->{delete_cb} && !$was_dirty) {
        local $@;
        eval { $self->_call_cb('delete_cb', $key); 1 };
    }
    return $deleted;
}

# ---------------------------------------------------------------- the API

sub add {
    my ($self, $key, $value, $expire) = @_;
    return $self->_store_plain($key, $value, $expire, $SET_MODE{add}) ? 1 : 0;
}

sub replace {
    my ($self, $key, $value, $expire) = @_;
    return $self->_store_plain($key, $value, $expire, $SET_MODE{replace}) ? 1 : 0;
}

sub incr {
    my ($self, $key, $delta, $initial, $expire) = @_;
    $delta = 1 unless defined $delta;
    $initial = 0 if @_ < 4;
    _check_int($delta, 'delta');
    _check_int($initial, 'initial value') if defined $initial;
    return $self->_incr($key, $delta, $initial, $expire);
}

sub decr {
    my ($self, $key, $delta, @rest) = @_;
    $delta = 1 unless defined $delta;
    _check_int($delta, 'delta');
    return $self->incr($key, -$delta, @rest);
}

sub _check_int {
    my ($n, $what) = @_;
    croak "Cache::Near: the $what must be an integer, got '" . (defined $n ? $n : 'undef') . "'"
        unless defined $n && !ref $n && $n =~ /\A[+-]?[0-9]+\z/
        && $n >= -9223372036854775808 && $n <= 9223372036854775807;
}

# Remove and return the value, atomically: the engine takes it out in one
# step. In list context (value, removed) as Cache::FastMmap.
sub get_and_remove {
    my ($self, $key) = @_;
    my ($value, $removed) = (undef, 0);
    my ($flags, $payload) = $self->_pop_raw($key);
    if (defined $flags) {
        my ($f, $body, $meta) = _unwrap($flags, $payload);
        if (defined $f && !_dead($meta)) {
            ($value) = $self->_decode_stored($key, $f, $body);
            $removed = 1;
        } elsif (defined $f && $meta->{tombstone}) {
            # A tombstone stays: taking it out was not this call's business.
            $self->_store_raw($key, $flags, $payload, 0, $SET_MODE{add});
        }
        if ($self->{delete_cb} && $removed && !$meta->{dirty}) {
            local $@;
            eval { $self->_call_cb('delete_cb', $key); 1 };
        }
    }
    return wantarray ? ($value, $removed) : $value;
}

sub _decode_stored {
    my ($self, $key, $flags, $payload) = @_;
    return $self->_decode_native($flags, $payload)
        if $flags < FLAG_USER && !defined $self->{signing_key};
    return $self->_decode_body($flags, $payload, $key);
}

# Atomic read-modify-write on the engine's compare-and-swap:
# $sub->($key, $old, { expire_on => ... }) returns the new value and
# optionally set's options ({ expire_time | expire_on | modseq }), or an
# empty list to store nothing. The read, $sub and the swap run with no
# lock held; if another process changed the entry meanwhile the swap
# fails and $sub runs again on the newer value (so $sub must not have
# side effects it cannot repeat). Returns the new value, or in list
# context (new value, stored).
sub get_and_set {
    my ($self, $key, $sub) = @_;
    croak 'Cache::Near: get_and_set needs a code reference' unless ref $sub eq 'CODE';
    for (;;) {
        my ($flags, $payload, $version) = $self->_read_versioned($key);
        my ($old, %info, $meta);
        if (defined $flags) {
            my ($f, $body);
            ($f, $body, $meta) = _unwrap($flags, $payload);
            if (defined $f && !_dead($meta)) {
                ($old) = $self->_decode_stored($key, $f, $body);
                my $on = $meta->{dirty} ? $meta->{expire_on_ms} : do {
                    my $at = $self->expires_at($key);
                    defined $at ? int($at * 1000 + 0.5) : 0;
                };
                $info{expire_on} = $on ? $on / 1000 : 0;
            }
        }
        my @new = $sub->($key, $old, \%info);
        return wantarray ? ($old, 0) : $old unless @new;
        my ($value, $opts) = @new;
        croak 'Cache::Near: get_and_set callback options must be a hash reference'
            if defined $opts && ref $opts ne 'HASH';
        my $modseq = $opts ? $opts->{modseq} : undef;
        if (defined $modseq) {
            croak "Cache::Near: the set option modseq must be an unsigned integer, got '$modseq'"
                unless !ref $modseq && $modseq =~ /\A[0-9]+\z/;
            $self->_tombstones_on;
            if ($meta && defined $meta->{modseq} && $modseq < $meta->{modseq}) {
                return wantarray ? ($value, 0) : $value;
            }
        } elsif ($meta && $meta->{tombstone} && $self->{_tombstones}) {
            return wantarray ? ($value, 0) : $value;
        }
        my ($ttl, $on) = $self->_expiry_of($opts);
        if ($ttl < 0) {
            next if defined $flags && !$self->_remove_version($key, $version);
            return wantarray ? ($value, 1) : $value;
        }
        my ($nf, $np) = $self->_encode_value($key, $value);
        my %nmeta = (modseq => $modseq);
        if ($self->{write_back}) {
            @nmeta{qw(dirty expire_on_ms)} = (1, $on);
            $ttl = 0;
        }
        ($nf, $np) = _wrap($nf, $np, \%nmeta);
        next unless $self->_swap($key, $nf, $np, $ttl, $version);
        if ($self->{write_cb} && !$self->{write_back}) {
            local $@;
            eval { $self->_call_cb('write_cb', $key, $value, $on > 0 ? $on / 1000 : $on); 1 };
        }
        return wantarray ? ($value, 1) : $value;
    }
}

# Expire one key now: a dirty value (write-back) is written back first.
# Returns whether the key was there.
sub expire {
    my ($self, $key) = @_;
    my ($flags, $payload) = $self->_pop_raw($key);
    return 0 unless defined $flags;
    my ($f, $body, $meta) = _unwrap($flags, $payload);
    return 0 unless defined $f;
    if ($meta->{tombstone}) {
        $self->_store_raw($key, $flags, $payload, 0, $SET_MODE{add});
        return 0;
    }
    if ($meta->{dirty} && $self->{write_cb}) {
        my ($value) = $self->_decode_stored($key, $f, $body);
        local $@;
        eval { $self->_call_cb('write_cb', $key, $value, ($meta->{expire_on_ms} || 0) / 1000); 1 };
    }
    return 1;
}

# multi_get([keys]) or, as Cache::FastMmap, multi_get($page_key, [keys]),
# whose entries are stored as "$page_key-$key". Returns a hashref of hits.
sub multi_get {
    my ($self, @args) = @_;
    my ($page, $keys) = @args == 1 ? (undef, $args[0]) : @args;
    croak 'Cache::Near: multi_get needs an array reference of keys' unless ref $keys eq 'ARRAY';
    return $self->_get_many($keys) unless defined $page;
    my $got = $self->_get_many([ map { "$page-$_" } @$keys ]);
    my $n = length($page) + 1;
    return { map { substr($_, $n) => $got->{$_} } keys %$got };
}

# multi_set({k => v}, [expire]) or multi_set($page_key, {k => v}, [expire]).
sub multi_set {
    my ($self, @args) = @_;
    my ($page, $pairs, $expire) = ref $args[0] eq 'HASH' ? (undef, @args) : @args;
    croak 'Cache::Near: multi_set needs a hash reference of key => value' unless ref $pairs eq 'HASH';
    my $prefix = defined $page ? "$page-" : '';
    if (ref $expire || $self->{_tombstones} || $self->{write_back}) {
        # Options hash, tombstones or write-back: one set each.
        $self->set("$prefix$_", $pairs->{$_}, $expire) for keys %$pairs;
        return 1;
    }
    $self->_set_many([ map { ("$prefix$_", $pairs->{$_}) } keys %$pairs ], $expire);
    return 1;
}

sub multi_remove {
    my ($self, $keys) = @_;
    croak 'Cache::Near: multi_remove needs an array reference of keys' unless ref $keys eq 'ARRAY';
    return $self->_delete_many($keys);
}

# get_keys(0): keys; get_keys(1): hashrefs { key, last_access, expire_on,
# flags, value_len, modseq }; get_keys(2): those with the value too.
# Tombstones and expired dirty entries are not listed.
sub get_keys {
    my ($self, $mode) = @_;
    $mode ||= 0;
    croak "Cache::Near: get_keys mode must be 0, 1 or 2, got '$mode'" unless $mode =~ /\A[012]\z/;
    my @rows = $self->_keys(1);
    my @special = map { $_->[0] } grep { $_->[2] & FASTMMAP_MASK } @rows;
    my $raw = @special || $mode == 2 ? $self->_raw_get_many($mode == 2 ? [ map { $_->[0] } @rows ] : \@special) : {};
    my @out;
    for my $row (@rows) {
        my ($key, $len, $flags, $exp) = @$row;
        my %item = (key => $key, value_len => $len, flags => $flags, expire_on => $exp / 1000, last_access => undef);
        if ($mode == 2 || $flags & FASTMMAP_MASK) {
            my $stored = $raw->{$key} or next;
            my ($f, $body, $meta) = _unwrap(@$stored);
            next if !defined $f || _dead($meta);
            if ($mode == 0) { push @out, $key; next }
            $item{modseq} = $meta->{modseq};
            $item{expire_on} = ($meta->{expire_on_ms} || 0) / 1000 if $meta->{dirty};
            $item{value_len} = length $body;
            if ($mode == 2) {
                my @v = $self->_decode_stored($key, $f, $body);
                next unless @v;
                $item{value} = $v[0];
            }
        }
        push @out, $mode == 0 ? $key : \%item;
    }
    return @out;
}

sub clear { my ($self) = @_; $self->_clear; return }

# empty(): write back every dirty entry (write-back mode), then remove
# everything; empty(1): only the expired entries (dirty ones written back
# first). Without write-back, empty(1) has nothing to do: the engine drops
# expired entries itself.
sub empty {
    my ($self, $only_expired) = @_;
    if ($self->{write_back}) {
        my $now = _now_ms();
        for my $row ($self->_keys(1)) {
            my ($key, undef, $flags) = @$row;
            next unless $flags & FLAG_DIRTY;
            my ($rf, $rp, $version) = $self->_read_versioned($key);
            next unless defined $rf;
            my ($f, $body, $meta) = _unwrap($rf, $rp);
            next unless defined $f && $meta->{dirty};
            my $expired = $meta->{expire_on_ms} && $meta->{expire_on_ms} <= $now;
            next if $only_expired && !$expired;
            # Take it out first (only if unchanged), then write it back.
            next unless $self->_remove_version($key, $version);
            if ($self->{write_cb}) {
                my ($value) = $self->_decode_stored($key, $f, $body);
                local $@;
                eval { $self->_call_cb('write_cb', $key, $value, ($meta->{expire_on_ms} || 0) / 1000); 1 };
            }
        }
    }
    $self->_clear unless $only_expired;
    return;
}

# Expired entries are never returned and the engine reclaims their space
# itself; purge removes what is left to remove: write-back entries past
# their expiry (not written back, as in Cache::FastMmap).
sub purge {
    my ($self) = @_;
    return unless $self->{write_back};
    my $now = _now_ms();
    for my $row ($self->_keys(1)) {
        my ($key, undef, $flags) = @$row;
        next unless $flags & FLAG_DIRTY;
        my ($rf, $rp, $version) = $self->_read_versioned($key);
        next unless defined $rf;
        my (undef, undef, $meta) = _unwrap($rf, $rp);
        $self->_remove_version($key, $version)
            if $meta && $meta->{dirty} && $meta->{expire_on_ms} && $meta->{expire_on_ms} <= $now;
    }
    return;
}

# (reads, read hits) since the cache file was created, from the engine's
# counters (kept whether or not enable_stats was given); with $clear,
# later calls on this object count from now.
sub get_statistics {
    my ($self, $clear) = @_;
    my $s = $self->stats;
    my ($reads, $hits) = ($s->{hits} + $s->{misses}, $s->{hits});
    my $base = $self->{_stats_base};
    my @out = ($reads - $base->[0], $hits - $base->[1]);
    $self->{_stats_base} = [ $reads, $hits ] if $clear;
    return @out;
}

1;

__END__

=head1 NAME

Cache::Near - shared-memory cache for many processes, a drop-in for Cache::FastMmap

=head1 SYNOPSIS

  use Cache::Near;

  my $cache = Cache::Near->new(
      share_file  => '/dev/shm/myapp.cache',
      cache_size  => '256m',
      expire_time => '10m',
  );
  $cache->set($key, $value);             # any scalar or reference (Storable)
  my $value = $cache->get($key);         # undef on a miss
  $cache->set($key, $value, '30s');      # this entry: 30 seconds
  $cache->set($key, $value, { expire_on => time + 60 });
  $cache->remove($key);
  $cache->exists($key);

  # Atomic across processes:
  $cache->get_and_set(hits => sub { my ($key, $old) = @_; ($old || 0) + 1 });
  my ($old, $removed) = $cache->get_and_remove($key);
  $cache->incr('counter');               # signed 64-bit, in place

  # Code written for Cache::FastMmap runs unchanged:
  my $fm = Cache::Near->new(page_size => '64k', num_pages => 89, serializer => '',
      read_cb => sub { $db->get($_[1]) }, write_cb => sub { $db->put($_[1], $_[2]) },
      write_action => 'write_back', empty_on_exit => 1);

=head1 DESCRIPTION

Cache::Near is a cache shared by all processes of a machine that open the
same file: a fixed-size memory-mapped file split into shards, each with a
robust process-shared lock, an open-addressing index and SIEVE eviction.
A process killed while holding a lock (even C<kill -9> in the middle of a
write) costs at most that one shard's entries; the next process to take
the lock repairs it. Large values (over 128 KiB by default) are kept in
files beside the cache file and read back transparently (see
L</"LARGE VALUES">). Reads, writes and deletes of one key are one engine
call each, taking one lock for a few hundred nanoseconds, with no system
call.

It implements every documented option and method of L<Cache::FastMmap>
(1.63) with FastMmap's meaning, so switching is replacing the module name;
L</"DIFFERENCES FROM Cache::FastMmap"> lists what nearcache's design makes
impossible or harmful. Cache::FastMmap's own test suite runs against it
(C<tools/fastmmap-suite.pl> in the distribution).

The same file can be read and written by the Python package C<nearcache>:
plain scalars are stored with the engine's native types (bytes, UTF-8
text, 64-bit integers, doubles, booleans, undef), which both languages map
to their own; see L</"SHARING WITH PYTHON">.

See the distribution's README for installation and docs/perl.md of the
nearcache source tree for the full guide.

=head1 CONSTRUCTOR

=head2 new(%options), new(\%options)

Opens (creating it if needed) the cache file. Unknown options croak.

=over

=item share_file

The cache file. The default is a new file in C</dev/shm/nearcache-$UID/>
(a memory file system: FastMmap's documentation recommends one), removed
when the object that created it is destroyed.

=item init_file

Empty the cache when opening it, and replace a file of another size.

=item cache_size

Total size: bytes, or with C<k>, C<m> or C<g> (default C<64m>, or the
size of an existing file when no size option is given). Another size
than the existing file's resizes it live: its entries are kept (on a
shrink, the most recently written that fit) and every process that has
it open, in Perl, Python or C, follows the new file at its next call
(C<init_file> or C<recreate> replace the file by an empty one instead).
A file written by another version of nearcache cannot be resized: the
error says C<incompatible cache file>, and C<recreate> with a
C<cache_size> replaces it.

=item page_size, num_pages

Cache::FastMmap's geometry: the file holds C<page_size> x C<num_pages>
bytes (defaults 64k and 89, pages rounded to a power of two of at least
4k), at least 20 KiB. The engine's shards are its own; only the total is
kept, and a value larger than a page is stored (L</"LARGE VALUES">).
With C<cache_size>, C<num_pages> and C<page_size> are informative.

=item shards

Shard count, a power of two; 0 (default) chooses from the size.

=item expire_time

Default time to live: seconds, or a number with a unit (C<s>, C<m>, C<h>,
C<d>, C<w>, or a word starting with one: C<'10m'>, C<'1 minute'>,
C<'2 hours'>), C<'never'> or C<'now'>. Default 0: never.

=item serializer

How references (and, with a custom pair, every value) become bytes:

  ''                        none: a reference is stored as the string it stringifies to
  'storable'                Storable (the default, as in Cache::FastMmap)
  'sereal'                  Sereal
  'json'                    JSON (readable from Python with serializer="json")
  [ \&serialize, \&deserialize ]
                            your own: serialize gets a reference to the value and
                            returns bytes; deserialize gets the bytes and returns a
                            reference to the value (FastMmap's convention)

Plain scalars (strings, numbers, undef) are stored natively whatever the
named serializer, so that they read back the same and the Python package
reads them too; a custom pair is applied to every value, as FastMmap does.

=item raw_values

Deprecated in Cache::FastMmap; true is C<serializer =E<gt> ''>.

=item compressor

Compress values: C<'zlib'> (Compress::Zlib), C<'lz4'> (Compress::LZ4),
C<'snappy'> (Compress::Snappy) or C<[ \&compress, \&uncompress ]>. Values
shorter than C<compress_threshold> (default 1024 bytes), and values that
do not shrink, are stored as they are.

=item compress

Deprecated in Cache::FastMmap; true is C<compressor =E<gt> 'zlib'>.

=item compress_threshold

See C<compressor>.

=item enable_stats

Accepted: the engine always counts reads and hits, see
C<get_statistics>.

=item tombstone_expire_time

Default lifetime of the tombstones C<remove> leaves with a modseq
(L</"TOMBSTONES AND MODSEQS">), in C<expire_time>'s format; 0 or unset:
C<expire_time>. Giving it also makes every write of this object respect
tombstones.

=item context, read_cb, write_cb, delete_cb, cache_not_found

As Cache::FastMmap: C<read_cb-E<gt>($context, $key)> is called on a miss,
and what it returns is stored (also C<undef> with C<cache_not_found>); C<write_cb-E<gt>($context, $key, $value,
$expire_on)> stores to the backing store (see C<write_action>);
C<delete_cb-E<gt>($context, $key)> is called by C<remove> (not for a
write-back entry never written back). C<$context> is the C<context>
option, or the cache. C<read_cb> may also return C<($value, { expire_on
=E<gt> $unix_seconds })> (or C<expire_time>) for the stored entry; any
other list counts by its last element, as FastMmap's scalar-context call
would. Exceptions in C<write_cb> and C<delete_cb> are
ignored, as in Cache::FastMmap; C<read_cb>'s propagate.

=item write_action

C<'write_through'> (default): C<write_cb> is called on every C<set>.
C<'write_back'>: C<set> marks the entry dirty and C<write_cb> is called
when it leaves the cache through C<empty>, C<expire>, C<empty_on_exit> or
C<get_and_remove>; see L</"WRITE-BACK">.

=item allow_recursive

Allow callbacks to call this cache. Without it a call from inside a
callback croaks ("already locked"), as in Cache::FastMmap. No lock is
held while a callback runs, so recursion is safe here; the check only
keeps FastMmap's contract.

=item empty_on_exit

Call C<empty> (writing dirty entries back) when the object that opened
the cache is destroyed, or at exit, in the process that opened it.

=item unlink_on_exit

Remove the file (and the directory of its spilled values) when the object
is destroyed, in the process that opened it. Default: true if this object
created the file, as in Cache::FastMmap.

=item permissions

Mode of a file this object creates (default 0640, as in
Cache::FastMmap); the owner must be able to read and write. A mode that
lets group or others write also accepts such files when opening (see
C<allow_foreign_owner>).

=item catch_deadlocks, start_slots

Accepted for compatibility and ignored: there are no fcntl locks to catch
(a lock held too long by a live process ends a wait after C<lock_timeout>),
and the engine sizes its indexes itself.

=item signing_key

Sign every value with HMAC-SHA256 (as the Python package's
C<signing_key>, with which it interoperates) and treat unsigned or
badly signed entries as misses.

=item create, recreate, allow_foreign_owner

Create the file if missing (default 1); replace a file made with other
parameters; accept a file owned by another user or writable by others.

=item lock_timeout

Longest wait, in seconds, for a shard lock that another live process holds
(stopped, traced, dumping core); default 0.05. Past it a read is a miss and
a write croaks ("shard lock was still held"), changing nothing.

=item spill_threshold

Values longer than this (as stored: after serialization, compression and
signing) are kept in files beside the cache file; a size as for
C<cache_size> (default C<128k>). See L</"LARGE VALUES">.

=item spill_budget

Most bytes those files may hold, a size as for C<cache_size> (default
C<1g>); past it, spilled values are evicted. C<0> turns spilling off:
every value is kept in the shared file, and one too large for a shard
croaks.

=item fs_reserve

How much of the file system (C</dev/shm>, or wherever C<share_file> is)
the cache leaves free for the other programs using it, a size as for
C<cache_size>. The cache's memory grows as it fills; past this reserve it
stops growing and evicts instead, and a large value's file is written only
after eviction made room for it. Default: the larger of 8 MiB and 10% of
the file system, at most 1 GiB (a 64 MiB C</dev/shm>, Docker's default,
keeps 8 MiB free). C<0> leaves no reserve.

=back

=head1 METHODS

Keys are strings (text: C<"caf\x{e9}"> with and without Perl's UTF-8 flag
is the same key); a reference key is its string form, C<''> is a key like
any other, and a key longer than 64 KiB of UTF-8 is never stored (reads
miss, writes return false). Expiry arguments are as C<expire_time>, or a
hash reference C<{ expire_time =E<gt> ... }> or C<{ expire_on =E<gt>
$unix_seconds }> (0: never).

=over

=item get($key [, \%options])

The value, or C<undef> on a miss (then C<read_cb> is asked, if given).
Options: C<modseq =E<gt> \my $modseq> receives the modseq the value was
stored with (undef if none).

=item set($key, $value [, $expire | \%options])

Store. Options: C<expire_time>, C<expire_on>, C<modseq> (a conditional
store, see L</"TOMBSTONES AND MODSEQS">). Returns true if stored, false if
refused (a tombstone or a newer modseq, a key too long). Croaks if the
value is longer than C<max_value_size> (nothing is changed then).

=item add($key, $value [, $expire]), replace($key, $value [, $expire])

Store only if absent / only if present; return whether stored.

=item remove($key [, \%options])

Remove; returns whether the key was present. Options: C<modseq> leaves a
tombstone instead (with C<expire_time> or C<expire_on> for its lifetime,
default C<tombstone_expire_time>).

=item exists($key)

Whether the key holds a value (a tombstone or an expired entry does not);
neither C<read_cb> nor the deserializer is called.

=item expire($key)

Remove the key now; in write-back mode a dirty value is written back
first. Returns whether it was there.

=item get_and_set($key, $sub)

Atomically replace the value with what C<$sub-E<gt>($key, $old_value,
{ expire_on =E<gt> ... })> returns, optionally followed by set's options
(C<expire_time>, C<expire_on>, C<modseq>). If C<$sub> returns an empty
list, nothing is stored. In scalar context returns the new value; in list
context C<($new_value, $stored)>.

Atomic across processes: it reads the entry and its version, runs
C<$sub> with no lock held, and stores with the engine's compare-and-swap
only if the entry is still that version; otherwise C<$sub> runs again on
the newer value (so it must not have side effects it cannot repeat).
Readers always see the old value or the new one, never a miss. C<$sub>
may call the cache (no deadlock is possible) and may die (nothing is
changed).

=item get_and_remove($key)

Remove and return the value in one engine step (two processes never both
get it). In list context C<($value, $removed)>.

=item incr($key [, $delta [, $initial [, $expire]]]), decr(...)

Add C<$delta> (default 1, may be negative) to a signed 64-bit counter and
return the new value; a missing key starts at C<$initial> (default 0;
C<undef> makes a missing key an error). Croaks on a value that is not a
counter or on overflow.

=item touch($key [, $expire])

Give the entry a new expiry; returns whether it was present.

=item expires_at($key)

Unix time (seconds, fractional) when the entry expires, 0 for never,
undef if absent.

=item multi_get(\@keys), multi_get($page_key, \@keys)

A hashref of the hits. With a page key (Cache::FastMmap's form) the
entries are C<"$page_key-$key">.

=item multi_set(\%pairs [, $expire]), multi_set($page_key, \%pairs [, $expire | \%options])

Store many; an entry too large for the cache croaks before anything is
stored.

=item multi_remove(\@keys)

Remove many; returns how many were present.

=item get_keys([$mode])

Mode 0: the keys. Mode 1: hashrefs with C<key>, C<expire_on> (Unix
seconds, 0 never), C<last_access> (always undef: see
L</"DIFFERENCES FROM Cache::FastMmap">), C<flags> (the stored flags
word), C<value_len>, C<modseq>. Mode 2: also C<value>. Keys that are not
text (bytes keys written from Python) are not listed.

=item clear

Remove every entry; no callback is called.

=item empty([$only_expired])

Write back every dirty entry (write-back mode) and remove every entry;
with C<$only_expired>, only the expired ones.

=item purge

Remove expired entries without writing them back. The engine never
returns expired entries and reclaims their space itself, so only
write-back entries are left for purge to remove.

=item get_statistics([$clear])

C<($reads, $read_hits)>: reads of the file since it was created, from
the engine's counters (all processes). With C<$clear>, later calls on
this object count from now.

=item count

Number of entries.

=item stats

A hashref of counters summed over shards: hits, misses, sets, deletes,
evictions, expirations, compactions, corruptions, resets and salvages
(repairs after a process died mid-write: a salvage keeps every complete
entry, a reset empties the shard), entries_lost, lock_timeouts, items and
the byte figures (held_bytes: the memory the file really holds); for
large values, spilled_values, spilled_bytes (held in their files) and
spill_refused (files missing or failing their checks: not served); and
max_compaction_bytes, the most arena bytes one compaction pass examined in
any shard (what a reader of that shard can wait for at most).

=item max_value_size

The longest value (as stored) accepted: the spill budget, or with
C<spill_budget =E<gt> 0> what fits in one entry.

=item max_entry_size, spill_threshold

The largest entry (key, value and a 20-byte header) kept in the shared
file, and the length over which values go to files.

=item capacity, shard_count

The bytes the shards hold, and how many there are.

=item max_key_length

The longest key, in bytes of UTF-8 (65536). A class method too.

=item default_directory

The directory of default cache files (C</dev/shm/nearcache-$UID>). A
class method too.

=item share_file, expire_time, raw_values, serializer

The options the object was opened with (C<expire_time> in seconds).
C<$cache-E<gt>{share_file}> and the other options work too, as with
Cache::FastMmap's objects.

=item check

Verify every shard (resetting corrupt ones); a hashref report.

=item close, is_closed

Unmap the file (later calls croak); whether it is closed.

=back

=head1 TOMBSTONES AND MODSEQS

As in Cache::FastMmap 1.63: C<remove($key, { modseq =E<gt> $n })> leaves
a tombstone recording the modseq of the invalidating change (a tombstone
never lowers its modseq); C<set($key, $value, { modseq =E<gt> $m })> is
refused if the key holds a tombstone or a value with a newer modseq, and
a plain C<set> is refused by any tombstone; C<get> and C<exists> see a
tombstone as a miss, C<get_keys> hides it, and a C<read_cb> value is
returned but not cached over it. The check and the store are one
compare-and-swap, so a stale write-back cannot slip between them.

A plain set stays one engine call until an object has seen tombstones:
objects opened with C<tombstone_expire_time>, and objects that wrote a
modseq or a tombstone, check for them on every write. Every process that
writes to a file with tombstones should therefore open it with
C<tombstone_expire_time>.

=head1 WRITE-BACK

With C<write_action =E<gt> 'write_back'>, C<set> stores the value marked
dirty, with its expiry time inside the entry; the backing store gets it
(C<write_cb>) when it leaves the cache through C<empty> (all or expired),
C<expire>, or C<empty_on_exit>, also after it expired, as in
Cache::FastMmap. Values read through C<read_cb> are stored clean.

One difference: an entry the engine B<evicts> to make room is not
written back, since the engine evicts under its shard lock and Perl code
never runs there. Size a write-back cache so that its dirty entries fit
(C<stats-E<gt>{evictions}> shows whether any were evicted), call C<empty>
regularly, or use write-through.

=head1 LARGE VALUES

Values longer than C<spill_threshold> (default 128 KiB), and any value
too large for one entry of its shard (C<max_entry_size>), are kept in
files in a directory beside the cache file, C<$share_file.spill/>, one
file per value, and read back transparently: C<get>, C<multi_get>,
C<get_and_remove> and the rest work as for any value, from every process
and from the Python package. Each file is written whole before the cache
names it and is checked (owner, permissions, length, checksum) when read;
a file that fails is a miss, counted in C<spill_refused>.

  my $cache = Cache::Near->new(share_file => $file, spill_budget => '4g');
  $cache->set(report => $pdf);                   # 40 MB: kept in a file
  my $max = $cache->max_value_size;              # 4 GiB here

The files hold at most C<spill_budget> bytes (default 1 GiB); past it,
spilled values are evicted. A value longer than the whole budget croaks
with a message naming C<spill_budget> and changes nothing. With
C<spill_budget =E<gt> 0> nothing is spilled and a value too large for a
shard croaks. On tmpfs (the default directory) the files are memory,
like the cache file.

=head1 SHARING WITH PYTHON

Plain scalars are stored with the engine's native types, which the Python
package reads as its own: a Perl string with the UTF-8 flag is a Python
str, other strings are bytes, integers are ints (and counters), doubles
floats, undef None. JSON-serialized values (C<serializer =E<gt> 'json'>
on both sides) and signed values (the same C<signing_key>) are read by
both. Storable, Sereal and custom serializers, lz4/snappy/custom
compression, and the write-back, tombstone and modseq marks (bits 16-18
of the flags word) are Perl's own: Python reads such entries as misses.

=head1 DIFFERENCES FROM Cache::FastMmap

What nearcache's design makes impossible or harmful to copy:

=over

=item No page limit

A key or value larger than a FastMmap page is stored (values over
C<spill_threshold> in files beside the cache), where FastMmap's C<set>
returns false. A value longer than C<max_value_size> (the spill budget,
1 GiB by default) croaks instead of returning false. Keys longer than
64 KiB are never stored (C<set> returns false).

=item Write-back and eviction

An evicted dirty entry is not written back (L</"WRITE-BACK">).

=item get_and_set runs C<$sub> without a lock

C<$sub> may run more than once when processes race (the value it
returns last is the one stored); FastMmap runs it once, under the page
lock. In exchange nothing can deadlock and other keys of the page are not
blocked.

=item No last access time

C<get_keys> gives C<last_access> as undef: the engine's SIEVE eviction
keeps a visited bit per entry, not a time.

=item Expiry that is not a time croaks

C<set($k, $v, 'garbage')>, C<''>, C<-1> or C<'s'> croak; FastMmap takes
them as "expire now". C<'now'> and C<{ expire_on =E<gt> $past }> work as
in FastMmap.

=item Statistics

C<enable_stats> is not needed: the engine always counts. C<get_statistics(1)>
resets what this object reports, not the counters of the file.

=item The file

A different layout (FastMmap cannot read it, nor Cache::Near FastMmap's),
in C</dev/shm/nearcache-$UID/> by default rather than C</tmp>, 64 MiB by
default rather than 5.6 MiB, at least 20 KiB. A file that group or others
can write is refused unless C<allow_foreign_owner> (or such
C<permissions>) is given. An existing file opened with another size
croaks rather than being silently re-initialised.

=item Tombstones need the option in every writer

See L</"TOMBSTONES AND MODSEQS">.

=item Re-entry from callbacks

Refused without C<allow_recursive>, as in FastMmap, although no lock is
held.

=back

=head1 ERRORS

Every error croaks with a message starting C<Cache::Near:>, and a failing
call leaves the cache unchanged.

=head1 SEE ALSO

L<CHI::Driver::Near>, L<Cache::FastMmap>.

=head1 LICENSE

MIT or Apache-2.0, at your option.

=cut
