package Cache::Near;

# The Perl face of nearcache's engine. The hot paths (get, set, remove
# without callbacks) are XS (Near.xs); this file holds the policy:
# options, serializers, compression, signing, callbacks, and the
# Cache::FastMmap-style conveniences built from the engine's primitives.

use strict;
use warnings;
use Carp qw(croak);
use Scalar::Util qw(blessed);

our $VERSION = '0.1.0';

require XSLoader;
XSLoader::load('Cache::Near', $VERSION);

# The flags word, shared with the Python package (nearcache.serializers):
# bits 0-3 native type, bit 4 "encoded", bits 5-6 compression, bit 7
# signed, bits 8-15 serializer id, bits 16-31 reserved.
use constant {
    FLAG_BYTES        => 0,
    FLAG_STR          => 1,
    FLAG_INT          => 2,
    FLAG_FLOAT        => 3,
    FLAG_BOOL         => 4,
    FLAG_NONE         => 5,
    FLAG_USER         => 16,
    FLAG_SIGNED       => 1 << 7,
    COMPRESSION_SHIFT => 5,
    SERIALIZER_SHIFT  => 8,
    NATIVE_MASK       => 0x0F,
    RESERVED_MASK     => 0xFFFF_0000,
    SIGNATURE_SIZE    => 32,
};

# Compression ids (bits 5-6): 1 is the Python package's zstd; 2 is zlib,
# written by this module.
use constant COMPRESSION_ZLIB => 2;

# Serializer ids (bits 8-15): 2 is JSON in both languages; 16 and 17 are
# Perl's Storable and Sereal (the Python package rejects them as foreign).
my %SERIALIZERS = (
    json     => { id => 2,  build => \&_json_codec },
    storable => { id => 16, build => \&_storable_codec },
    sereal   => { id => 17, build => \&_sereal_codec },
);

my %SET_MODE = (set => 0, add => 1, replace => 2);

my %KNOWN_OPTION = map { $_ => 1 } qw(
    share_file cache_size shards expire_time raw_values serializer compress
    compress_threshold signing_key read_cb write_cb delete_cb write_action
    cache_not_found context init_file unlink_on_exit create recreate
    allow_foreign_owner lock_timeout spill_threshold spill_budget
);

my %SIZE_UNIT = (k => 1 << 10, m => 1 << 20, g => 1 << 30);
my %TIME_UNIT = (s => 1, m => 60, h => 3600, d => 86400, w => 604800);

sub new {
    my ($class, %opt) = @_;
    my @unknown = grep { !$KNOWN_OPTION{$_} } sort keys %opt;
    croak "Cache::Near->new: unknown option(s): @unknown" if @unknown;

    my $size = _parse_size(defined $opt{cache_size} ? $opt{cache_size} : '64m');
    my $shards = defined $opt{shards} ? $opt{shards} : 0;
    croak "Cache::Near->new: shards must be 0 (auto) or a power of two up to 65536, got '$shards'"
        unless $shards =~ /\A[0-9]+\z/ && $shards <= 65536 && ($shards & ($shards - 1)) == 0;

    my $default_ttl_ms = _parse_expire(defined $opt{expire_time} ? $opt{expire_time} : 0);

    my %self = (
        raw_values      => $opt{raw_values} ? 1 : 0,
        compress        => $opt{compress} ? 1 : 0,
        compress_threshold => _parse_size(defined $opt{compress_threshold} ? $opt{compress_threshold} : 1024),
        cache_not_found => $opt{cache_not_found} ? 1 : 0,
        context         => $opt{context},
        expire_time     => $default_ttl_ms / 1000,
    );
    for my $cb (qw(read_cb write_cb delete_cb)) {
        next unless defined $opt{$cb};
        croak "Cache::Near->new: $cb must be a code reference" unless ref $opt{$cb} eq 'CODE';
        $self{$cb} = $opt{$cb};
    }
    my $write_action = defined $opt{write_action} ? $opt{write_action} : 'write_through';
    croak "Cache::Near->new: write_action '$write_action' is not supported (only write_through)"
        unless $write_action eq 'write_through';

    unless ($self{raw_values}) {
        my $name = defined $opt{serializer} ? lc $opt{serializer} : _default_serializer();
        my $spec = $SERIALIZERS{$name}
            or croak "Cache::Near->new: unknown serializer '$name' (known: "
            . join(', ', sort keys %SERIALIZERS) . ')';
        @self{qw(freeze thaw)} = $spec->{build}->();
        $self{serializer} = $name;
        $self{serializer_id} = $spec->{id};
    } elsif (defined $opt{serializer} && $opt{serializer} ne '' && lc $opt{serializer} ne 'raw') {
        croak "Cache::Near->new: raw_values and serializer '$opt{serializer}' exclude each other";
    }
    if (defined $opt{signing_key}) {
        croak 'Cache::Near->new: signing_key must be a string' if ref $opt{signing_key};
        require Digest::SHA;
        my $key = $opt{signing_key};
        utf8::encode($key) if utf8::is_utf8($key);
        croak 'Cache::Near->new: signing_key must be at least 16 bytes (as in the Python package)'
            if length $key < 16;
        $self{signing_key} = $key;
    }
    require Compress::Zlib if $self{compress};

    my $path = $opt{share_file};
    my $unlink = $opt{unlink_on_exit};
    if (!defined $path || $path eq '') {
        $path = sprintf '%s/perl-%d-%d-%d', Cache::Near->default_directory, $$, time, int rand 1e9;
        $unlink = 1 unless defined $unlink;
    }
    $self{share_file} = $path;
    $self{unlink_on_exit} = $unlink ? 1 : 0;

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
    my $hooked = grep { $self{$_} } qw(read_cb write_cb delete_cb);
    my $perl_encode = $self{compress} || defined $self{signing_key};
    my $cache = $class->_open(
        $path, $size, $shards,
        (exists $opt{create} ? ($opt{create} ? 1 : 0) : 1),
        ($opt{recreate} ? 1 : 0),
        ($opt{allow_foreign_owner} ? 1 : 0),
        $lock_timeout_ms, $spill_threshold, $spill_budget, $no_spill,
        $default_ttl_ms, ($hooked ? 1 : 0), ($perl_encode ? 1 : 0),
        (defined $self{signing_key} ? 1 : 0), \%self,
    );
    $cache->_clear if $opt{init_file};
    return $cache;
}

sub DESTROY {
    my ($self) = @_;
    my $o = $self->_opts;
    return unless $o;
    my $unlink = $o->{unlink_on_exit} && $self->_owner_pid == $$;
    $self->_free;
    return unless $unlink;
    unlink $o->{share_file};
    _remove_spill_dir($o->{share_file});
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

sub share_file  { $_[0]->_opts->{share_file} }
sub expire_time { $_[0]->_opts->{expire_time} }
sub raw_values  { $_[0]->_opts->{raw_values} }
sub serializer  { $_[0]->_opts->{serializer} }

sub _parse_size {
    my ($size) = @_;
    croak "Cache::Near: size '$size' is not a number of bytes (optionally with k, m or g)"
        unless defined $size && $size =~ /\A\s*([0-9]+)\s*([kmg]?)b?\s*\z/i;
    return $1 * ($2 ? $SIZE_UNIT{ lc $2 } : 1);
}

# Milliseconds of an expiry: seconds, or a number with s/m/h/d/w, or
# "never" (0 = never expires).
sub _parse_expire {
    my ($spec) = @_;
    croak 'Cache::Near: the expire time is undefined' unless defined $spec;
    return 0 if $spec =~ /\A\s*never\s*\z/i;
    croak "Cache::Near: expire time '$spec' is not seconds (optionally with s, m, h, d or w) or 'never'"
        unless $spec =~ /\A\s*([0-9]+(?:\.[0-9]*)?)\s*([smhdw]?)\s*\z/i;
    return int($1 * ($2 ? $TIME_UNIT{ lc $2 } : 1) * 1000 + 0.5);
}

sub _expire_ms { my ($self, $spec) = @_; return _parse_expire($spec) }

sub _default_serializer {
    return eval { require Sereal::Encoder; require Sereal::Decoder; 1 } ? 'sereal' : 'storable';
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

# (flags, payload) of a value: the native form of a plain scalar, else
# the serializer's; then compression and signing as configured.
sub _encode {
    my ($self, $value, $key) = @_;
    my $o = $self->_opts;
    my ($flags, $body) = $self->_encode_native($value);
    my $serializer_id = 0;
    if (!defined $flags) {
        croak 'Cache::Near: cannot store a reference with raw_values (configure a serializer)'
            if $o->{raw_values};
        $body = eval { $o->{freeze}->($value) };
        croak "Cache::Near: the $o->{serializer} serializer cannot encode the value: $@" unless defined $body;
        ($flags, $serializer_id) = (0, $o->{serializer_id});
    }
    my $compression = 0;
    if ($o->{compress} && length $body >= $o->{compress_threshold}) {
        my $packed = Compress::Zlib::compress($body);
        ($body, $compression) = ($packed, COMPRESSION_ZLIB) if length $packed < length $body;
    }
    my $signing_key = $o->{signing_key};
    return ($flags, $body) if !$serializer_id && !$compression && !defined $signing_key;
    $flags |= FLAG_USER | ($compression << COMPRESSION_SHIFT) | ($serializer_id << SERIALIZER_SHIFT);
    if (defined $signing_key) {
        $flags |= FLAG_SIGNED;
        $body = _tag($signing_key, $flags, $key, $body) . $body;
    }
    return ($flags, $body);
}

# The value of a stored (flags, payload), or () to treat it as a miss
# (unknown flags, bad signature, foreign serializer or compression).
sub _decode {
    my ($self, $flags, $payload, $key) = @_;
    my $o = $self->_opts;
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
        return unless $compression == COMPRESSION_ZLIB;
        require Compress::Zlib;
        $body = Compress::Zlib::uncompress($body);
        return unless defined $body;
    }
    my $serializer_id = ($flags >> SERIALIZER_SHIFT) & 0xFF;
    return $self->_decode_native($flags & NATIVE_MASK, $body) unless $serializer_id;
    return if $flags & NATIVE_MASK;
    return if $o->{raw_values} || $serializer_id != $o->{serializer_id};
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

# ---------------------------------------------------------------- callbacks

sub _cb_context { my ($self) = @_; my $c = $self->_opts->{context}; return defined $c ? $c : $self }

sub _get_hooked {
    my ($self, $key) = @_;
    my @hit = $self->_get_plain($key);
    return $hit[0] if @hit;
    my $o = $self->_opts;
    return undef unless $o->{read_cb};
    my $value = $o->{read_cb}->($self->_cb_context, $key);
    $self->_store_plain($key, $value, undef, 0) if defined $value || $o->{cache_not_found};
    return $value;
}

sub _set_hooked {
    my ($self, $key, $value, $expire) = @_;
    my $o = $self->_opts;
    $self->_store_plain($key, $value, $expire, 0);
    $o->{write_cb}->($self->_cb_context, $key, $value) if $o->{write_cb};
    return 1;
}

sub _remove_hooked {
    my ($self, $key) = @_;
    my $o = $self->_opts;
    my $deleted = $self->_remove_plain($key);
    $o->{delete_cb}->($self->_cb_context, $key) if $o->{delete_cb};
    return $deleted ? 1 : 0;
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

sub get_and_remove {
    my ($self, $key) = @_;
    my @hit = $self->_pop_plain($key);
    return @hit ? $hit[0] : undef;
}

# Atomic read-modify-write: $sub->($key, $old) returns the new value (and
# optionally { expire_time => ... }), or an empty list to store nothing.
# Optimistic: the new value replaces the old one only if the old one is
# still there (compare-and-delete, then add); otherwise $sub runs again on
# the newer value.
sub get_and_set {
    my ($self, $key, $sub) = @_;
    croak 'Cache::Near: get_and_set needs a code reference' unless ref $sub eq 'CODE';
    for (;;) {
        my ($flags, $payload) = $self->_raw_get($key);
        my $old;
        if (defined $flags) {
            my @v = $self->_decode_stored($flags, $payload, $key);
            $old = $v[0];
        }
        my @new = $sub->($key, $old);
        return wantarray ? ($old, 0) : $old unless @new;
        my ($value, $opt) = @new;
        my $expire = ref $opt eq 'HASH' ? $opt->{expire_time} : undef;
        if (defined $flags) {
            next unless $self->_delete_if_equals($key, $payload);
        }
        next unless $self->_store_plain($key, $value, $expire, $SET_MODE{add});
        return wantarray ? ($value, 1) : $value;
    }
}

sub _decode_stored {
    my ($self, $flags, $payload, $key) = @_;
    return $flags < FLAG_USER && !defined $self->_opts->{signing_key}
        ? $self->_decode_native($flags, $payload)
        : $self->_decode($flags, $payload, $key);
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
    $self->_set_many([ map { ("$prefix$_", $pairs->{$_}) } keys %$pairs ], $expire);
    return 1;
}

sub multi_remove {
    my ($self, $keys) = @_;
    croak 'Cache::Near: multi_remove needs an array reference of keys' unless ref $keys eq 'ARRAY';
    return $self->_delete_many($keys);
}

# get_keys(0): keys; get_keys(1): hashrefs { key, expire_time, flags,
# value_len }; get_keys(2): those with the value too.
sub get_keys {
    my ($self, $mode) = @_;
    $mode ||= 0;
    croak "Cache::Near: get_keys mode must be 0, 1 or 2, got '$mode'" unless $mode =~ /\A[012]\z/;
    return $self->_keys(0) if $mode == 0;
    my @out;
    for my $row ($self->_keys(1)) {
        my ($key, $len, $flags, $exp) = @$row;
        my %item = (key => $key, value_len => $len, flags => $flags, expire_time => $exp / 1000);
        if ($mode == 2) {
            my @hit = $self->_get_plain($key);
            next unless @hit;
            $item{value} = $hit[0];
        }
        push @out, \%item;
    }
    return @out;
}

sub clear { my ($self) = @_; $self->_clear; return }

# Cache::FastMmap's empty(): the same as clear here.
sub empty { my ($self) = @_; $self->_clear; return }

# Expired entries are never returned and their space is reclaimed when
# their shard compacts; there is nothing left for purge to do. Kept so
# that code written for Cache::FastMmap runs unchanged.
sub purge { return }

1;

__END__

=head1 NAME

Cache::Near - shared-memory cache for many processes, on nearcache's engine

=head1 SYNOPSIS

  use Cache::Near;

  my $cache = Cache::Near->new(
      share_file  => '/dev/shm/myapp.cache',
      cache_size  => '256m',
      expire_time => '10m',
  );
  $cache->set($key, $value);           # any scalar or reference
  my $value = $cache->get($key);       # undef on a miss
  $cache->set($key, $value, 30);       # expires in 30 seconds
  $cache->remove($key);
  $cache->incr('hits');                # atomic 64-bit counter
  $cache->add($key, $value);           # only if absent
  my $hits = $cache->multi_get([qw(a b c)]);

=head1 DESCRIPTION

Cache::Near is a cache shared by all processes of a machine that open the
same file: a fixed-size memory-mapped file split into shards, each with a
robust process-shared lock, an open-addressing index and SIEVE eviction.
A process killed while holding a lock (even C<kill -9> in the middle of a
write) costs at most that one shard's entries; the next process to take
the lock repairs it. Large values (over 128 KiB by default) are kept in
files beside the cache file and read back transparently (see
L</"LARGE VALUES">); a value that cannot be stored is refused with an
error and the cache is left as it was.

Its interface follows L<Cache::FastMmap> where that makes sense, so
switching is mostly a search-and-replace, and the same file can be read
and written by the Python package C<nearcache>: plain scalars are stored
with the engine's native types (bytes, UTF-8 text, 64-bit integers,
doubles, booleans, undef), which both languages map to their own.

See the distribution's README for installation and docs/perl.md of the
nearcache source tree for the full guide.

=head1 CONSTRUCTOR

=head2 new(%options)

=over

=item share_file

The cache file. The default is a new file in C</dev/shm/nearcache-$UID/>,
removed when the object that created it is destroyed.

=item cache_size

Total size: bytes, or with C<k>, C<m> or C<g> (default C<64m>). An
existing file opened with a different size is an error unless
C<recreate> is set.

=item shards

Shard count, a power of two; 0 (default) chooses from the size.

=item expire_time

Default time to live: seconds, or a number with C<s>, C<m>, C<h>, C<d> or
C<w>, or C<never> (default 0: never).

=item raw_values

Store plain scalars only; storing a reference croaks. Without it, values
that are references go through the serializer.

=item serializer

C<sereal> (the default when Sereal is installed), C<storable> (the
default otherwise) or C<json> (readable from Python with
C<serializer="json">).

=item compress, compress_threshold

Compress values of at least C<compress_threshold> bytes (default 1024)
with zlib.

=item signing_key

Sign every value with HMAC-SHA256 (as the Python package's
C<signing_key>, with which it interoperates) and treat unsigned or
badly signed entries as misses.

=item read_cb, write_cb, delete_cb, context, cache_not_found

As Cache::FastMmap: C<read_cb-E<gt>($context, $key)> is called on a miss
and what it returns is stored (also C<undef> with C<cache_not_found>);
C<write_cb-E<gt>($context, $key, $value)> after each C<set> (write-through);
C<delete_cb-E<gt>($context, $key)> after each C<remove>. C<$context> is
the C<context> option, or the cache. Only C<write_action =E<gt> 'write_through'>
is supported.

=item init_file

Empty the cache when opening it.

=item unlink_on_exit

Remove the file (and the directory of its spilled values) when the
creating object is destroyed (default: only for the default temporary
file).

=item create, recreate, allow_foreign_owner

Create the file if missing (default 1); replace a file made with other
parameters; accept a file owned by another user.

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

=back

=head1 METHODS

=over

=item get($key)

The value, or C<undef> on a miss. Keys are strings (text: C<"caf\x{e9}">
with and without Perl's UTF-8 flag is the same key).

=item set($key, $value [, $expire])

Store; C<$expire> as C<expire_time>. Returns 1. Croaks if the value is
longer than C<max_value_size> (nothing is changed then).

=item add($key, $value [, $expire]), replace($key, $value [, $expire])

Store only if absent / only if present; return whether stored.

=item remove($key)

Returns whether the key was present.

=item get_and_set($key, $sub)

Atomically replace the value with C<$sub-E<gt>($key, $old_value)>. If
C<$sub> returns an empty list, nothing is stored. C<$sub> may return
C<($value, { expire_time =E<gt> ... })>. It runs again if another process
changed the value meanwhile, so it must not have side effects.

=item get_and_remove($key)

Remove and return the value (atomic).

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

=item multi_set(\%pairs [, $expire]), multi_set($page_key, \%pairs [, $expire])

Store many; an entry too large for the cache croaks before anything is
stored.

=item multi_remove(\@keys)

Remove many; returns how many were present.

=item get_keys([$mode])

Mode 0: the keys. Mode 1: hashrefs with C<key>, C<expire_time> (Unix
seconds, 0 never), C<flags>, C<value_len>. Mode 2: also C<value>.

=item clear, empty

Remove every entry.

=item purge

Does nothing: expired entries are never returned and their space is
reclaimed automatically. Present for Cache::FastMmap compatibility.

=item count

Number of entries.

=item stats

A hashref of counters summed over shards: hits, misses, sets, deletes,
evictions, expirations, compactions, corruptions, resets and salvages
(repairs after a process died mid-write: a salvage keeps every complete
entry, a reset empties the shard), entries_lost, lock_timeouts, items and
the byte figures (held_bytes: the memory the file really holds); for
large values, spilled_values, spilled_bytes (held in their files) and
spill_refused (files missing or failing their checks: not served).

=item max_value_size

The longest value (as stored) accepted: the spill budget, or with
C<spill_budget =E<gt> 0> what fits in one entry.

=item max_entry_size, spill_threshold

The largest entry (key, value and a 20-byte header) kept in the shared
file, and the length over which values go to files.

=item check

Verify every shard (resetting corrupt ones); a hashref report.

=item close

Unmap the file; later calls croak.

=back

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

=head1 ERRORS

Every error croaks with a message starting C<Cache::Near:>, and a failing
call leaves the cache unchanged.

=head1 SEE ALSO

L<CHI::Driver::Near>, L<Cache::FastMmap>.

=cut
