# Round trips with the Python package on one file: values set from Perl
# read back in Python with their types, and the other way round, plain,
# JSON-serialized, signed and large (spilled to files).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use NearTest qw(fresh_file);
use Cache::Near;

my $python = $ENV{NEARCACHE_PYTHON} || 'python3';
if (system($python, '-c', 'import nearcache') != 0) {
    $ENV{NEARCACHE_REQUIRE_PYTHON}
        ? BAIL_OUT("$python cannot import nearcache (pip install -e . first)")
        : plan(skip_all => "$python cannot import nearcache");
}
require JSON::PP;
my $json = JSON::PP->new->canonical->utf8;

my $SIZE = 8 << 20;

# Run Python code with the cache `c` open on $file; returns its stdout.
sub python {
    my ($file, $opts, $code) = @_;
    my $script = "import json, sys, nearcache\n"
        . "c = nearcache.Cache(path=sys.argv[1], size=$SIZE$opts)\n$code";
    open my $fh, '-|', $python, '-c', $script, $file or die "cannot run $python: $!";
    local $/;
    my $out = <$fh>;
    close $fh;
    is($?, 0, 'python ran') or diag $out;
    return $out;
}

subtest 'Perl writes, Python reads' => sub {
    my $file = fresh_file('py1');
    my $c = Cache::Near->new(share_file => $file, cache_size => $SIZE);
    $c->set(bytes => "\x00\xff\x10");
    $c->set(text => "caf\x{e9} \x{263a}");
    $c->set(int => -1234567890123);
    $c->set(float => 2.5);
    $c->set(none => undef);
    $c->incr('counter', 41);
    $c->set("cl\x{e9}" => 'unicode key');
    my $out = python($file, '', <<'PY');
out = {}
for k in ["bytes", "text", "int", "float", "none", "counter", "cl\u00e9"]:
    v = c.get(k, "MISSING")
    out[k] = [type(v).__name__, v.hex() if isinstance(v, bytes) else v]
print(json.dumps(out))
PY
    is_deeply($json->decode($out), {
        bytes   => ['bytes', '00ff10'],
        text    => ['str', "caf\x{e9} \x{263a}"],
        int     => ['int', -1234567890123],
        float   => ['float', 2.5],
        none    => ['NoneType', undef],
        counter => ['int', 41],
        "cl\x{e9}" => ['bytes', unpack('H*', 'unicode key')],
    }, 'bytes, str, int, float, None and counters keep their types; text keys are the same keys');
};

subtest 'Python writes, Perl reads' => sub {
    my $file = fresh_file('py2');
    python($file, '', <<'PY');
c.set("bytes", b"\x00\xff\x10")
c.set("text", "caf\u00e9 \u263a")
c.set("int", 2**62)
c.set("float", 0.125)
c.set("true", True)
c.set("none", None)
c.incr("counter", 7)
c.set("structure", {"pickled": 1})
PY
    my $c = Cache::Near->new(share_file => $file, cache_size => $SIZE);
    is($c->get('bytes'), "\x00\xff\x10", 'bytes');
    is($c->get('text'), "caf\x{e9} \x{263a}", 'str');
    ok(utf8::is_utf8($c->get('text')), '... as text');
    is($c->get('int'), 4611686018427387904, 'int (2**62)');
    is($c->get('float'), 0.125, 'float');
    ok($c->get('true'), 'bool');
    ok(!defined $c->get('none'), 'None');
    is($c->incr('counter'), 8, 'a Python counter counts on in Perl');
    ok(!defined $c->get('structure'), 'a pickled value is a miss for Perl (never unpickled)');
};

subtest 'int, text and bytes keys from Python' => sub {
    my $file = fresh_file('pykeys');
    python($file, '', <<'PY');
c.set(5, "int key")
c.set("5", "text key")
c.set(b"\xff5", "bytes key that is not UTF-8")
c.set("caf\u00e9", "text key, not ASCII")
PY
    my $c = Cache::Near->new(share_file => $file, cache_size => $SIZE);
    is($c->get('5'), 'text key', 'the Perl key "5" is the Python str "5", not the int 5');
    is($c->get("caf\x{e9}"), 'text key, not ASCII', 'non-ASCII text keys match');
    is_deeply([sort $c->get_keys], [sort '5', "caf\x{e9}"],
        'get_keys lists the keys a Perl string can name (not int keys, not non-UTF-8 bytes)');
    $c->remove('5');
    my $out = python($file, '', 'print(json.dumps([c.get(5), c.get("5")]))' . "\n");
    is_deeply($json->decode($out), ['int key', undef], 'removing "5" from Perl leaves the int key 5');
};

subtest 'JSON-serialized values, both ways' => sub {
    my $file = fresh_file('py3');
    my $c = Cache::Near->new(share_file => $file, cache_size => $SIZE, serializer => 'json');
    $c->set(from_perl => { list => [1, 'two'], text => "\x{263a}" });
    my $out = python($file, ', serializer="json"', <<'PY');
print(json.dumps(c.get("from_perl")))
c.set("from_python", {"nested": {"n": [1.5, None, True]}})
PY
    is_deeply($json->decode($out), { list => [1, 'two'], text => "\x{263a}" }, 'Python reads Perl JSON');
    my $v = $c->get('from_python');
    is_deeply([ $v->{nested}{n}[0], $v->{nested}{n}[1] ], [1.5, undef], 'Perl reads Python JSON');
    ok($v->{nested}{n}[2], '... booleans included');
};

subtest 'signed values, both ways' => sub {
    my $file = fresh_file('py4');
    my $c = Cache::Near->new(share_file => $file, cache_size => $SIZE, serializer => 'json',
        signing_key => 'a shared secret of 32 bytes......');
    $c->set(perl_signed => [1, 2, 3]);
    $c->set(perl_signed_text => "signed \x{263a}");
    my $out = python($file, ', serializer="json", signing_key="a shared secret of 32 bytes......"', <<'PY');
print(json.dumps([c.get("perl_signed"), c.get("perl_signed_text")]))
c.set("python_signed", {"ok": 1})
c.set("python_signed_int", 99)
PY
    is_deeply($json->decode($out), [[1, 2, 3], "signed \x{263a}"], 'Python verifies Perl signatures');
    is_deeply($c->get('python_signed'), { ok => 1 }, 'Perl verifies Python signatures');
    is($c->get('python_signed_int'), 99, '... of native values too');
    my $wrong = Cache::Near->new(share_file => $file, cache_size => $SIZE, serializer => 'json',
        signing_key => 'another secret of 32 bytes.......');
    ok(!defined $wrong->get('python_signed'), 'another key rejects them');
};

subtest 'large values spilled to files, both ways' => sub {
    require Digest::SHA;
    my $file = fresh_file('pybig');
    my $c = Cache::Near->new(share_file => $file, cache_size => $SIZE);
    my $big = pack 'N*', 1 .. (3 << 18);                 # 3 MiB: more than a shard holds
    cmp_ok(length $big, '>', $c->max_entry_size, 'the value is larger than an entry');
    $c->set(from_perl => $big);
    $c->set(text_from_perl => "\x{263a}" x (50 << 10));  # 150 KiB of UTF-8: over the threshold
    is($c->stats->{spilled_values}, 2, 'both are spilled');
    my $out = python($file, '', <<'PY');
import hashlib
v = c.get("from_perl")
t = c.get("text_from_perl")
c.set("from_python", bytes(range(256)) * 8192)
print(json.dumps([type(v).__name__, len(v), hashlib.sha256(v).hexdigest(), t == "\u263a" * (50 << 10)]))
PY
    is_deeply($json->decode($out), ['bytes', length $big, Digest::SHA::sha256_hex($big), JSON::PP::true()],
        'Python reads a value spilled from Perl, bytes and text');
    my $from_python = $c->get('from_python');
    ok(defined $from_python && $from_python eq join('', map { chr } 0 .. 255) x 8192,
        'Perl reads a 2 MiB value spilled from Python');
};

done_testing;
