# The Cache::Near API: values and their types, expiry, atomic operations,
# multi-key calls, keys, stats.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(sleep);
use NearTest qw(fresh_cache fresh_file);
use Cache::Near;

my $c = fresh_cache();

subtest 'plain scalars round-trip with their types' => sub {
    $c->set(bytes => "\x00\xffbinary");
    is($c->get('bytes'), "\x00\xffbinary", 'binary string');
    ok(!utf8::is_utf8($c->get('bytes')), '... without the UTF-8 flag');
    $c->set(text => "caf\x{e9} \x{263a}");
    is($c->get('text'), "caf\x{e9} \x{263a}", 'text');
    ok(utf8::is_utf8($c->get('text')), '... with the UTF-8 flag');
    $c->set(int => -42);
    is($c->get('int'), -42, 'negative integer');
    $c->set(big => 9223372036854775807);
    is($c->get('big'), 9223372036854775807, 'largest signed 64-bit integer');
    $c->set(float => 0.25);
    is($c->get('float'), 0.25, 'double');
    $c->set(empty => '');
    is($c->get('empty'), '', 'empty string is a hit');
    $c->set(undef_value => undef);
    ok(!defined $c->get('undef_value'), 'undef comes back undef');
    ok(!defined $c->get('never set'), 'miss is undef');
};

subtest 'references go through the serializer' => sub {
    my $v = { list => [1, 2, 3], text => "\x{263a}", nested => { a => undef } };
    $c->set(ref => $v);
    is_deeply($c->get('ref'), $v, 'hash of lists round-trips');
    my $raw = fresh_cache(serializer => '');
    my $list = [1];
    ok($raw->set(ref => $list), "serializer '' stores a reference ...");
    is($raw->get('ref'), "$list", '... as the string it stringifies to (as Cache::FastMmap)');
};

subtest 'keys are text: with or without the UTF-8 flag' => sub {
    my $latin1 = "caf\xe9";
    my $upgraded = $latin1;
    utf8::upgrade($upgraded);
    $c->set($latin1, 'one');
    is($c->get($upgraded), 'one', 'the same key whatever its internal form');
    ok((grep { $_ eq $latin1 } $c->get_keys), 'get_keys returns it');
};

subtest 'add, replace, remove, get_and_remove' => sub {
    ok($c->add(a => 1), 'add stores a new key');
    ok(!$c->add(a => 2), '... not an existing one');
    is($c->get('a'), 1, '... which keeps its value');
    ok($c->replace(a => 3), 'replace stores over an existing key');
    ok(!$c->replace(nope => 3), '... not a missing one');
    ok(!defined $c->get('nope'), '... which stays missing');
    is($c->get_and_remove('a'), 3, 'get_and_remove returns the value');
    ok(!defined $c->get('a'), '... and removes it');
    $c->set(r => 1);
    ok($c->remove('r'), 'remove says the key was present');
    ok(!$c->remove('r'), '... and then absent');
};

subtest 'counters are signed 64-bit' => sub {
    is($c->incr('n'), 1, 'incr starts at 0');
    is($c->incr('n', 10), 11, 'incr by 10');
    is($c->decr('n', 20), -9, 'decr below zero');
    is($c->incr('m', 5, 100), 105, 'initial value');
    eval { $c->incr('missing', 1, undef) };
    like($@, qr/key not found/, 'no initial value: a missing key croaks');
    $c->set(word => 'abc');
    eval { $c->incr('word') };
    like($@, qr/not a 64-bit integer counter/, 'incr of a string croaks');
    is($c->get('word'), 'abc', '... and leaves it');
    $c->set(top => 9223372036854775807);
    eval { $c->incr('top') };
    like($@, qr/overflow/, 'overflow croaks');
    is($c->get('top'), 9223372036854775807, '... and leaves the counter');
    $c->set(seven => 7);
    is($c->incr('seven'), 8, 'an integer set from Perl is a counter');
};

subtest 'expiry' => sub {
    my $e = fresh_cache(expire_time => '1s');
    is($e->expire_time, 1, 'expire_time in seconds');
    $e->set(short => 'x');
    $e->set(long => 'y', '1h');
    $e->set(forever => 'z', 'never');
    cmp_ok($e->expires_at('long') - time, '>', 3500, 'per-item expire_time with a unit');
    is($e->expires_at('forever'), 0, "'never' never expires");
    ok(!defined $e->expires_at('absent'), 'expires_at of a missing key is undef');
    sleep 1.2;
    ok(!defined $e->get('short'), 'the default expiry applies');
    is($e->get('long'), 'y', 'a longer per-item expiry keeps the entry');
    ok($e->touch('long', 1), 'touch gives a new expiry');
    ok(!$e->touch('short', 10), 'touch of an expired key says absent');
    sleep 1.2;
    ok(!defined $e->get('long'), '... which applies');
    is($e->get('forever'), 'z', 'never-expiring entry is still there');
    ok(!(grep { $_ eq 'short' } $e->get_keys), 'expired keys are not listed');
    $e->purge;
    is($e->get('forever'), 'z', 'purge keeps live entries');
};

subtest 'get_and_set is atomic read-modify-write' => sub {
    $c->set(gs => 10);
    is(scalar $c->get_and_set(gs => sub { $_[1] + 5 }), 15, 'returns the new value');
    is($c->get('gs'), 15, '... and stores it');
    my @r = $c->get_and_set(gs => sub { return });
    is_deeply(\@r, [15, 0], 'an empty list stores nothing');
    is(scalar $c->get_and_set(new_key => sub { defined $_[1] ? 'had' : 'fresh' }), 'fresh', 'missing key: undef');
    is(scalar $c->get_and_set(gs => sub { ('v', { expire_time => 60 }) }), 'v', 'with an expire_time');
    cmp_ok($c->expires_at('gs') - time, '>', 50, '... which applies');
};

subtest 'multi_get, multi_set, multi_remove' => sub {
    $c->multi_set({ m1 => 'a', m2 => [1, 2], m3 => 3 });
    is_deeply($c->multi_get([qw(m1 m2 m3 m4)]), { m1 => 'a', m2 => [1, 2], m3 => 3 }, 'hits only');
    $c->multi_set(page => { x => 1, y => 2 });
    is($c->get('page-x'), 1, "Cache::FastMmap's page keys: stored as page-key");
    is_deeply($c->multi_get(page => [qw(x y z)]), { x => 1, y => 2 }, '... and read back by page');
    is($c->multi_remove([qw(m1 m2 nothing)]), 2, 'multi_remove counts the present keys');
    is_deeply($c->multi_get([]), {}, 'empty key list');
};

subtest 'get_keys modes, count, clear, stats, check' => sub {
    my $k = fresh_cache();
    $k->set(one => 'v1');
    $k->set(two => 22, 100);
    is_deeply([sort $k->get_keys], [qw(one two)], 'mode 0: keys');
    my %m1 = map { $_->{key} => $_ } $k->get_keys(1);
    is($m1{one}{value_len}, 2, 'mode 1: value length');
    is($m1{one}{expire_on}, 0, 'mode 1: never expires');
    cmp_ok($m1{two}{expire_on}, '>', time, 'mode 1: expiry time (Unix seconds)');
    ok(exists $m1{one}{last_access} && !defined $m1{one}{last_access}, 'mode 1: no last access time is kept');
    my %m2 = map { $_->{key} => $_->{value} } $k->get_keys(2);
    is_deeply(\%m2, { one => 'v1', two => 22 }, 'mode 2: values');
    is($k->count, 2, 'count');
    my $s = $k->stats;
    is($s->{items}, 2, 'stats: items');
    ok(exists $s->{hits} && exists $s->{evictions}, 'stats: counters');
    ok(exists $s->{salvages} && exists $s->{lock_timeouts}, 'stats: repair and lock counters');
    ok($s->{held_bytes} > 0 && $s->{held_bytes} <= $s->{file_bytes} + 4096,
        'stats: held_bytes within the file');
    is($k->check->{entries}, 2, 'check: entries');
    $k->clear;
    is($k->count, 0, 'clear empties');
};

subtest 'large values' => sub {
    my $big = fresh_cache(cache_size => '64m', shards => 4);
    my $max = $big->max_entry_size;
    # An entry fits one arena segment of its shard (96 KiB to about 256 KiB).
    cmp_ok($max, '>=', 96 << 10, 'a 64 MiB cache of 4 shards takes entries of a segment ...');
    cmp_ok($max, '<', 1 << 20, '... and no more: larger values go to files');
    is($big->spill_threshold, 128 << 10, 'values over 128 KiB go to files by default');
    is($big->max_value_size, 1 << 30, '... up to the default spill budget, 1 GiB');
    my $v = pack 'N*', 1 .. (5 << 18);
    $big->set(huge => $v);
    ok($big->get('huge') eq $v, 'a 5 MiB value round-trips');
    my $over = substr(pack('N*', reverse 1 .. ($max / 4 + 1)), 0, $max + 1);
    is(length $over, $max + 1, 'a value one byte over max_entry_size ...');
    $big->set(over => $over);
    ok($big->get('over') eq $over, '... round-trips (kept in a file)');
    $big->set(text => "\x{263a}" x (100 << 10));
    is($big->get('text'), "\x{263a}" x (100 << 10), 'spilled text keeps its type');
    my $got = $big->multi_get([qw(huge over nothing)]);
    ok($got->{huge} eq $v && $got->{over} eq $over && keys %$got == 2, 'multi_get reads spilled values');
    my %len = map { $_->{key} => $_->{value_len} } $big->get_keys(1);
    is($len{over}, $max + 1, 'get_keys reports the value length');
    my $s = $big->stats;
    is($s->{spilled_values}, 3, 'stats: spilled_values');
    is($s->{spilled_bytes}, length($v) + length($over) + 3 * (100 << 10), 'stats: spilled_bytes');
    is($s->{spill_refused}, 0, 'stats: spill_refused');
    ok(exists $s->{max_compaction_bytes}, 'stats: max_compaction_bytes');
    ok(-d $big->share_file . '.spill', 'the files are in a directory beside the cache file');
    ok($big->get_and_remove('over') eq $over, 'get_and_remove of a spilled value');
    ok(!defined $big->get('over'), '... removes it');
    is($big->stats->{spilled_values}, 2, '... and its file');
};

subtest 'the spill budget bounds spilled values' => sub {
    my $c = fresh_cache(spill_budget => '2m', spill_threshold => '64k');
    is($c->max_value_size, 2 << 20, 'max_value_size is the spill budget');
    is($c->spill_threshold, 64 << 10, 'spill_threshold takes a size');
    $c->set(small => 'x' x (64 << 10));
    is($c->stats->{spilled_values}, 0, 'a value at the threshold stays inline');
    my $v = 'a' x (1 << 20);
    $c->set(k => $v);
    is($c->stats->{spilled_values}, 1, 'a value over it spills');
    eval { $c->set(k => 'b' x (3 << 20)) };
    like($@, qr/exceeds the 2097152-byte spill budget.*spill_budget.*left unchanged/,
        'a value over the budget croaks, naming spill_budget');
    ok($c->get('k') eq $v, '... and loses nothing');
    eval { $c->set(other => 'c' x (3 << 20)) };
    ok(!defined $c->get('other'), '... and stores nothing');
    eval { $c->multi_set({ m1 => 'm', m2 => 'd' x (3 << 20) }) };
    like($@, qr/spill budget/, 'multi_set with a value over the budget croaks');
    ok(!defined $c->get('m1'), '... before storing anything');
    my $w = 'e' x (1536 << 10);
    $c->set(k2 => $w);
    ok($c->get('k2') eq $w, 'a value that needs room in the budget is stored ...');
    cmp_ok($c->stats->{spilled_bytes}, '<=', 2 << 20, '... evicting spilled values to stay within it');
    is($c->get('small'), 'x' x (64 << 10), 'inline values are not evicted for it');
};

subtest 'spill_budget => 0 keeps every value inline' => sub {
    my $c = fresh_cache(cache_size => '64m', shards => 4, spill_budget => 0);
    my $max = $c->max_entry_size;
    cmp_ok($c->max_value_size, '<', $max, 'max_value_size is what fits in one entry');
    my $v = pack 'N*', 1 .. (($max - 1024) / 4);
    $c->set(huge => $v);
    ok($c->get('huge') eq $v, 'a value of nearly max_entry_size round-trips');
    is($c->stats->{spilled_values}, 0, '... inline');
    eval { $c->set(too_big => 'x' x ($max + 1)) };
    like($@, qr/exceeds the \d+-byte entry limit.*left unchanged/, 'a value over the entry limit croaks clearly');
    ok($c->get('huge') eq $v, '... and loses nothing');
    ok(!defined $c->get('too_big'), '... and stores nothing');
    ok(!-e $c->share_file . '.spill', 'no directory of spilled values');
};

subtest 'the spilled values of a temporary cache go with it' => sub {
    my $tmp = Cache::Near->new(cache_size => '1m');
    my $dir = $tmp->share_file . '.spill';
    $tmp->set(big => 'z' x (2 << 20));
    ok(-d $dir, 'a temporary cache spills beside its file');
    undef $tmp;
    ok(!-e $dir, '... and the directory is removed with the object');
};

subtest 'the file is shared by objects and survives them' => sub {
    my $file = fresh_file('share');
    my $w = Cache::Near->new(share_file => $file, cache_size => '4m');
    $w->set(k => 'v');
    my $r = Cache::Near->new(share_file => $file, cache_size => '4m');
    is($r->get('k'), 'v', 'a second object sees the value');
    undef $r;
    ok(-e $file, 'a second object leaves the file it did not create');
    undef $w;
    ok(!-e $file, 'the object that created it removes it (unlink_on_exit defaults to 1 then)');
    $w = Cache::Near->new(share_file => $file, cache_size => '4m', unlink_on_exit => 0);
    $w->set(k => 'v');
    undef $w;
    ok(-e $file, 'unlink_on_exit => 0 keeps it');
    $r = Cache::Near->new(share_file => $file, cache_size => '4m');
    my $i = Cache::Near->new(share_file => $file, cache_size => '4m', init_file => 1);
    ok(!defined $i->get('k'), 'init_file empties it');
    my $tmp = Cache::Near->new(cache_size => '1m');
    my $path = $tmp->share_file;
    ok(-e $path, 'the default file exists');
    undef $tmp;
    ok(!-e $path, '... and is removed with its object');
    $r->close;
    ok($r->is_closed, 'close');
    eval { $r->get('k') };
    like($@, qr/closed/, 'a closed cache croaks');
};

done_testing;
