# Serializers, compression, signing, read/write/delete callbacks, and bad
# arguments (a clear croak, nothing lost).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use NearTest qw(fresh_cache fresh_file);
use Cache::Near;

my $value = { list => [1, 'two', 3.5], text => "\x{263a}", flag => undef };

for my $ser (qw(storable json sereal)) {
    subtest "serializer $ser" => sub {
        plan skip_all => 'Sereal is not installed'
            if $ser eq 'sereal' && !eval { require Sereal::Encoder; require Sereal::Decoder; 1 };
        my $file = fresh_file($ser);
        my $c = Cache::Near->new(share_file => $file, cache_size => '4m', serializer => $ser);
        is($c->serializer, $ser, 'configured');
        $c->set(v => $value);
        is_deeply($c->get('v'), $value, 'a structure round-trips');
        $c->set(plain => 'text');
        is($c->get('plain'), 'text', 'plain scalars stay native');
        my $other = Cache::Near->new(share_file => $file, cache_size => '4m',
            serializer => $ser eq 'json' ? 'storable' : 'json');
        ok(!defined $other->get('v'), 'another serializer treats the entry as a miss');
        is($other->get('plain'), 'text', '... but reads native values');
    };
}

subtest 'compression' => sub {
    my $file = fresh_file('z');
    my $c = Cache::Near->new(share_file => $file, cache_size => '4m', compress => 1);
    my $long = 'abc' x 10_000;
    $c->set(long => $long);
    is($c->get('long'), $long, 'a compressed string round-trips');
    my %meta = map { $_->{key} => $_ } $c->get_keys(1);
    cmp_ok($meta{long}{value_len}, '<', length($long) / 10, 'it is stored compressed');
    $c->set(struct => { big => [ (1) x 5000 ] });
    is(scalar @{ $c->get('struct')->{big} }, 5000, 'a compressed structure round-trips');
    $c->set(short => 'x');
    is($c->get('short'), 'x', 'values under the threshold are stored as they are');
    my $plain = Cache::Near->new(share_file => $file, cache_size => '4m');
    is($plain->get('long'), $long, 'a cache without compress still decompresses');
};

subtest 'signing' => sub {
    my $file = fresh_file('sig');
    my $signed = Cache::Near->new(share_file => $file, cache_size => '4m', signing_key => 'a secret of at least 16 bytes');
    my $plain = Cache::Near->new(share_file => $file, cache_size => '4m');
    $signed->set(s => $value);
    is_deeply($signed->get('s'), $value, 'signed structure round-trips');
    $signed->set(n => 5);
    is($signed->get('n'), 5, 'signed native value round-trips');
    $plain->set(u => 'unsigned');
    ok(!defined $signed->get('u'), 'a signed cache rejects unsigned entries');
    my $wrong = Cache::Near->new(share_file => $file, cache_size => '4m', signing_key => 'another secret, 16+ bytes');
    ok(!defined $wrong->get('s'), 'a wrong key rejects the entry');
    $plain->set(n => 5);
    ok(!defined $signed->get('n'), '... also when an unsigned writer replaced a signed one');
    eval { Cache::Near->new(share_file => $file, cache_size => '4m', signing_key => 'short') };
    like($@, qr/signing_key must be at least 16 bytes/, 'a short signing key croaks');
};

subtest 'read_cb, write_cb, delete_cb' => sub {
    my (@reads, @writes, @deletes);
    my $c = fresh_cache(
        context   => 'ctx',
        read_cb   => sub { push @reads, [@_]; return $_[1] eq 'known' ? 'loaded' : undef },
        write_cb  => sub { push @writes, [@_] },
        delete_cb => sub { push @deletes, [@_] },
    );
    is($c->get('known'), 'loaded', 'a miss calls read_cb');
    is($c->get('known'), 'loaded', '... whose value is then cached');
    is(scalar @reads, 1, '... so read_cb ran once');
    is_deeply($reads[0], ['ctx', 'known'], 'read_cb gets the context and key');
    ok(!defined $c->get('unknown'), 'read_cb returning undef is a miss');
    $c->set(w => 'v');
    is_deeply(\@writes, [['ctx', 'w', 'v', 0]], 'write_cb after set, with the expiry time (0: never)');
    ok($c->remove('w'), 'remove');
    is_deeply(\@deletes, [['ctx', 'w']], 'delete_cb after remove');
    my $nf = fresh_cache(read_cb => sub { undef }, cache_not_found => 1);
    $nf->get('x');
    is($nf->count, 1, 'cache_not_found stores the miss');
};

subtest 'bad arguments croak clearly and lose nothing' => sub {
    my $c = fresh_cache();
    $c->set(keep => 'safe');
    my @cases = (
        [sub { $c->set(undef, 1) }, qr/the key is undefined/, 'undef key'],
        [sub { $c->incr('k' x 70_000) }, qr/longer than 65536 bytes/, 'key too long for a counter'],
        [sub { $c->set(k => 1, -5) }, qr/expire time must be >= 0/, 'negative expire'],
        [sub { $c->set(k => 1, 'soon') }, qr/expire time 'soon' is not seconds/, 'bad expire'],
        [sub { $c->set(k => 1, { expire_on => 'tomorrow' }) }, qr/expire_on 'tomorrow' is not a Unix time/, 'bad expire_on'],
        [sub { $c->set(k => 1, { modseq => -1 }) }, qr/modseq must be an unsigned integer/, 'bad modseq'],
        [sub { $c->get_and_set(k => sub { (1, 'x') }) }, qr/options must be a hash reference/, 'get_and_set options not a hash'],
        [sub { $c->incr('k', 'many') }, qr/delta must be an integer/, 'bad delta'],
        [sub { $c->incr('k', 1, '1e99') }, qr/initial value must be an integer/, 'bad initial'],
        [sub { $c->get_and_set('k', 'nope') }, qr/needs a code reference/, 'get_and_set without code'],
        [sub { $c->multi_get('not a list') }, qr/array reference of keys/, 'multi_get of a scalar'],
        [sub { $c->multi_set([1]) }, qr/hash reference/, 'multi_set of a list'],
        [sub { $c->multi_set({ ok => 1, k => [] }, 'later') }, qr/expire time 'later'/, 'multi_set with a bad expiry'],
        [sub { $c->get_keys(7) }, qr/mode must be 0, 1 or 2/, 'bad get_keys mode'],
        [sub { Cache::Near->new(share_file => fresh_file(), cache_size => 'big') }, qr/size 'big' is not a number/, 'bad cache_size'],
        [sub { Cache::Near->new(share_file => fresh_file(), shards => 3) }, qr/power of two/, 'bad shards'],
        [sub { Cache::Near->new(share_file => fresh_file(), serializer => 'yaml') }, qr/unknown serializer 'yaml'/, 'unknown serializer'],
        [sub { Cache::Near->new(share_file => fresh_file(), colour => 'red') }, qr/unknown option\(s\): colour/, 'unknown option'],
        [sub { Cache::Near->new(share_file => fresh_file(), lock_timeout => 'soon') }, qr/lock_timeout must be a positive number/, 'bad lock_timeout'],
        [sub { Cache::Near->new(share_file => fresh_file(), lock_timeout => -1) }, qr/lock_timeout must be a positive number/, 'negative lock_timeout'],
        [sub { Cache::Near->new(share_file => fresh_file(), spill_budget => 'lots') }, qr/size 'lots' is not a number/, 'bad spill_budget'],
        [sub { Cache::Near->new(share_file => fresh_file(), fs_reserve => 'most') }, qr/size 'most' is not a number/, 'bad fs_reserve'],
        [sub { Cache::Near->new(share_file => fresh_file(), spill_threshold => 0) }, qr/spill_threshold must be at least 1 byte/, 'spill_threshold of 0'],
        [sub { Cache::Near->new(share_file => fresh_file(), read_cb => 'x') }, qr/read_cb must be a code reference/, 'bad callback'],
        [sub { Cache::Near->new(share_file => fresh_file(), write_action => 'write_later') }, qr/write_action must be 'write_through' or 'write_back'/, 'bad write_action'],
        [sub { Cache::Near->new(share_file => fresh_file(), serializer => [sub {}]) }, qr/custom serializer is \[/, 'bad custom serializer'],
        [sub { Cache::Near->new(share_file => fresh_file(), compressor => 'rar') }, qr/unknown compressor 'rar'/, 'unknown compressor'],
        [sub { Cache::Near->new(share_file => fresh_file(), permissions => 0400) }, qr/permissions must be a file mode/, 'unusable permissions'],
        [sub { Cache::Near->new(share_file => fresh_file(), page_size => 'huge') }, qr/page_size must be a positive number/, 'bad page_size'],
        [sub { Cache::Near->new(share_file => '/dev/null/x', cache_size => '1m') }, qr{Cache::Near: .*/dev/null}, 'unusable path'],
        [sub { Cache::Near::get('not an object', 'k') }, qr/not a Cache::Near object/, 'function call on a non-object'],
    );
    for my $case (@cases) {
        my ($code, $re, $name) = @$case;
        eval { $code->() };
        like($@, $re, $name);
    }
    my $timed = Cache::Near->new(share_file => fresh_file('lt'), cache_size => '1m', lock_timeout => 0.2);
    $timed->set(t => 1);
    is($timed->get('t'), 1, 'a cache opened with lock_timeout works');
    is($c->get('keep'), 'safe', 'the cache still holds its value');
    is($c->count, 1, '... and nothing else');
    my $file = fresh_file('geom');
    Cache::Near->new(share_file => $file, cache_size => '4m', unlink_on_exit => 0)->set(x => 1);
    my $grown = Cache::Near->new(share_file => $file, cache_size => '8m');
    is($grown->get('x'), 1, 'reopening with another size resizes the file, keeping its entries');
    my $again = Cache::Near->new(share_file => $file);
    is($again->get('x'), 1, '... which others then open as it is');
    cmp_ok($again->capacity, '>', 6 * 1024 * 1024, '... at its new size');
    # A file of another layout: named in this module's options.
    my $other = fresh_file('layout');
    Cache::Near->new(share_file => $other, cache_size => '1m', unlink_on_exit => 0)->set(x => 1);
    open my $fh, '+<', $other or die "open $other: $!";
    binmode $fh;
    seek $fh, 8, 0;
    print {$fh} pack('V', 0xFFFF);
    close $fh;
    eval { Cache::Near->new(share_file => $other, cache_size => '4m') };
    like($@, qr/layout version.*opened with cache_size => '4m'.*recreate => 1 to replace/s,
        'a file of another layout: the error names cache_size and recreate');
    unlike($@, qr/size=None|recreate=true/, '... never the Python or Rust spelling');
    eval { Cache::Near->new(share_file => $other) };
    like($@, qr/recreate => 1 and a cache_size/, '... and asks for a size when none was given');
    my $fresh = Cache::Near->new(share_file => $other, cache_size => '1m', recreate => 1);
    $fresh->set(y => 2);
    is($fresh->get('y'), 2, '... and recreate replaces it');
};

subtest 'fs_reserve: the cache leaves the file system its share' => sub {
    my $dir = fresh_file('fsr-probe') =~ s{/[^/]*\z}{}r;
    my ($avail) = `df -B1 --output=avail '$dir' 2>/dev/null` =~ /(\d+)\s*\z/;
    plan skip_all => "df cannot tell the space left in $dir" unless $avail;
    eval { Cache::Near->new(share_file => fresh_file('fsr-huge'), cache_size => '16m', fs_reserve => '1000000g') };
    like($@, qr/no room for the cache file/, 'a reserve larger than the file system: a clear error at open');
    # A reserve that leaves the cache 1 MiB to grow into: sets evict
    # within it instead of failing; with no reserve the cache holds all.
    my %held;
    for my $reserve ($avail - (1 << 20), 0) {
        my $c = Cache::Near->new(share_file => fresh_file("fsr$reserve"), cache_size => '16m',
            shards => 1, fs_reserve => $reserve);
        my $ok = 1;
        for my $i (1 .. 20_000) {
            $ok &&= eval { $c->set("key$i", 'v' x 400); 1 };
        }
        ok($ok, "fs_reserve => $reserve: 20,000 sets succeed");
        is($c->get('key20000'), 'v' x 400, '... and the last is held');
        $held{$reserve} = $c->count;
    }
    my ($small) = grep { $_ } keys %held;
    cmp_ok($held{$small}, '<', $held{0} / 4,
        "the reserved cache stayed small ($held{$small} entries held against $held{0})");
};

done_testing;
