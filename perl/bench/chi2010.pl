#!/usr/bin/perl
# Seed 000 ("Perl cache modules performance", January 2010) re-run in Perl,
# with Cache::Near and CHI::Driver::Near beside the modules of the study,
# plus seed 001's Set/Get/Mix shape ("Comparison of different PERL caching
# modules", 2004) for the same modules, and seed 001's complex-data rows
# (Storable-frozen hashes of 5/16/55 keys) against Cache::FastMmap and
# BerkeleyDB.
#
#   perl -Iperl/Cache-Near/blib/lib -Iperl/Cache-Near/blib/arch perl/bench/chi2010.pl \
#       [--seconds 1 | --count N] [--only 'C:Near,C:FMmap'] [--cases '1:10 medium,...'] [--no-seed001] \
#       [--json out.json] [--markdown out.md]
#
# Seed 000: keys are 36-character UUID strings; values are random bytes of
# 16 (small), 160 (medium) and 1600 (large) bytes. One Benchmark iteration
# is a set followed by N gets of stored keys (set:get = 1:N), so the
# cmpthese rates are blocks per second, as in the study; ops/s (sets +
# gets) is given beside them. memcached runs on a free loopback port,
# started and stopped (by PID) by this script.
use strict;
use warnings;
use Benchmark qw(timethese cmpthese);
use Config;
use File::Temp qw(tempdir);
use Getopt::Long;
use IO::Socket::INET;
use POSIX qw(WNOHANG);
use Time::HiRes qw(time sleep);

my %opt = (seconds => 1, seed001 => 1);
GetOptions(\%opt, 'seconds=f', 'count=i', 'repeats=i', 'only=s', 'cases=s', 'seed001!', 'json=s', 'markdown=s', 'keys=i')
    or die "usage: $0 [--seconds S | --count N] [--only names] [--cases list] [--no-seed001] [--json F] [--markdown F]\n";
$opt{keys} ||= 500;
$opt{repeats} ||= 5;    # seed 001: each figure is the median of this many fresh runs

my %have;
for my $m (qw(Cache::Near CHI CHI::Driver::Near Cache::FastMmap Cache::Memcached::Fast
    CHI::Driver::Memcached::Fast Storable BerkeleyDB)) {
    $have{$m} = eval "require $m; 1" ? 1 : 0;
}
die "Cache::Near is not built: run make in perl/Cache-Near first\n" unless $have{'Cache::Near'};

my $dir = tempdir('nearcache-perl-bench-XXXX', TMPDIR => 1, CLEANUP => 1);
my $shm = Cache::Near->default_directory;
my @cleanup_files;

# ---------------------------------------------------------------- memcached

my ($memcached_pid, $memcached_port);

sub free_port {
    my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 1, ReuseAddr => 1)
        or die "no free port: $!";
    my $port = $s->sockport;
    close $s;
    return $port;
}

sub start_memcached {
    my $bin = (grep { -x } map {"$_/memcached"} split /:/, "$ENV{PATH}:/usr/bin:/usr/sbin")[0] or return;
    $memcached_port = free_port();
    my $pid = fork;
    die "fork: $!" unless defined $pid;
    if (!$pid) {
        open STDOUT, '>', '/dev/null';
        open STDERR, '>', '/dev/null';
        exec $bin, '-l', '127.0.0.1', '-p', $memcached_port, '-U', '0', '-m', '256', '-t', '1',
            ($> == 0 ? ('-u', 'root') : ())
            or POSIX::_exit(127);
    }
    $memcached_pid = $pid;
    for (1 .. 100) {
        return 1 if IO::Socket::INET->new(PeerAddr => "127.0.0.1:$memcached_port", Timeout => 1);
        sleep 0.05;
    }
    stop_memcached();
    return;
}

sub stop_memcached {
    return unless $memcached_pid;
    kill 'TERM', $memcached_pid;
    waitpid $memcached_pid, 0;
    undef $memcached_pid;
}

END { stop_memcached(); unlink @cleanup_files }
$SIG{INT} = $SIG{TERM} = sub { stop_memcached(); exit 1 };

my $have_memcached = ($have{'Cache::Memcached::Fast'} || $have{'CHI::Driver::Memcached::Fast'}) && start_memcached();

my %machine = machine();

# ---------------------------------------------------------------- the caches

# name => [description, constructor]; each constructor returns an object
# with get and set.
my @CACHES = (
    ['C:Near' => 'Cache::Near, raw_values' => sub {
        my $f = "$shm/bench-near-$$";
        push @cleanup_files, $f;
        Cache::Near->new(share_file => $f, cache_size => '64m', raw_values => 1, init_file => 1);
    }],
    ['C:Near:S' => 'Cache::Near, default serializer (plain strings stay native)' => sub {
        my $f = "$shm/bench-near-s-$$";
        push @cleanup_files, $f;
        Cache::Near->new(share_file => $f, cache_size => '64m', serializer => 'storable', init_file => 1);
    }],
    ['CHI:Near' => 'CHI::Driver::Near' => sub {
        my $f = "$shm/bench-chi-near-$$";
        push @cleanup_files, $f;
        CHI->new(driver => 'Near', share_file => $f, cache_size => '64m', namespace => 'bench');
    }],
    ['C:FMmap' => 'Cache::FastMmap, raw values' => sub {
        Cache::FastMmap->new(share_file => "$dir/fm-raw", cache_size => '64m', serializer => '',
            init_file => 1, unlink_on_exit => 1);
    }],
    ['C:FMmap:S' => 'Cache::FastMmap, Storable' => sub {
        Cache::FastMmap->new(share_file => "$dir/fm-storable", cache_size => '64m',
            serializer => 'storable', init_file => 1, unlink_on_exit => 1);
    }],
    ['CHI:Mem' => 'CHI::Driver::Memory (max_size set)' => sub {
        CHI->new(driver => 'Memory', datastore => {}, max_size => 64 << 20);
    }],
    ['CHI:FMmap' => 'CHI::Driver::FastMmap' => sub {
        CHI->new(driver => 'FastMmap', root_dir => "$dir/chi-fm", cache_size => '64m');
    }],
    ['CHI:File' => 'CHI::Driver::File' => sub {
        CHI->new(driver => 'File', root_dir => "$dir/chi-file");
    }],
    ['C:Mc:F' => 'Cache::Memcached::Fast over TCP loopback' => sub {
        Cache::Memcached::Fast->new({ servers => ["127.0.0.1:$memcached_port"] });
    }],
    ['CHI:Mc:F' => 'CHI::Driver::Memcached::Fast over TCP loopback' => sub {
        CHI->new(driver => 'Memcached::Fast', servers => ["127.0.0.1:$memcached_port"], namespace => 'b');
    }],
);

my %needs = (
    'CHI:Near' => ['CHI', 'CHI::Driver::Near'],
    'C:FMmap' => ['Cache::FastMmap'], 'C:FMmap:S' => ['Cache::FastMmap'],
    'CHI:Mem' => ['CHI'], 'CHI:File' => ['CHI'], 'CHI:FMmap' => ['CHI', 'Cache::FastMmap'],
    'C:Mc:F' => ['Cache::Memcached::Fast'], 'CHI:Mc:F' => ['CHI', 'CHI::Driver::Memcached::Fast'],
);
my %only = map { $_ => 1 } split /,/, ($opt{only} || '');
my (@names, %make, %skipped, %desc);
for my $c (@CACHES) {
    my ($name, $desc, $make) = @$c;
    next if %only && !$only{$name};
    my @missing = grep { !$have{$_} } @{ $needs{$name} || [] };
    if (@missing) { $skipped{$name} = "not installed: @missing"; next }
    if ($name =~ /Mc/ && !$have_memcached) { $skipped{$name} = 'memcached not available'; next }
    push @names, $name;
    $make{$name} = $make;
    $desc{$name} = $desc;
}

# ---------------------------------------------------------------- data

srand 2010;
sub uuid { sprintf '%08x-%04x-%04x-%04x-%04x%08x', map { int rand 2**$_ } 32, 16, 16, 16, 16, 32 }
sub random_bytes { join '', map { chr int rand 256 } 1 .. $_[0] }
my @keys = map { uuid() } 1 .. $opt{keys};
my %SIZE = (small => 16, medium => 160, large => 1600);
my %values = map { my $n = $SIZE{$_}; ($_ => [ map { random_bytes($n) } 1 .. 64 ]) } keys %SIZE;

my @cases = (['1:10', 'small'], ['1:10', 'medium'], ['1:10', 'large'], ['1:1', 'medium'], ['1:100', 'medium']);
if ($opt{cases}) {
    my %want = map { $_ => 1 } split /,/, $opt{cases};
    @cases = grep { $want{"$_->[0] $_->[1]"} } @cases;
}

# ---------------------------------------------------------------- seed 000

my (%result, @tables);
print "# Seed 000 in Perl: set:get blocks, Benchmark::cmpthese\n";
for my $case (@cases) {
    my ($ratio, $size) = @$case;
    my ($gets) = $ratio =~ /1:(\d+)/;
    my $vals = $values{$size};
    my %subs;
    my %objs;
    for my $name (@names) {
        my $c = $objs{$name} = $make{$name}->();
        $c->set($keys[$_], $vals->[$_ % @$vals]) for 0 .. $#keys;
        my ($i, $j) = (0, 0);
        my ($nk, $nv) = (scalar @keys, scalar @$vals);
        my $misses = 0;
        $subs{$name} = sub {
            $c->set($keys[$i % $nk], $vals->[$i % $nv]);
            $i++;
            for (1 .. $gets) {
                defined $c->get($keys[$j++ % $nk]) or $misses++;
            }
        };
        $result{"$ratio $size"}{$name}{misses} = \$misses;
    }
    print "\nBenchmarking caches with ratio $ratio and $size values\n\n";
    my (%rate, $text);
    if ($opt{count}) {
        # --count N (smoke runs): exactly N iterations each, timed on the
        # wall clock with Time::HiRes (too short for CPU times).
        for my $name (@names) {
            my $t0 = time;
            $subs{$name}->() for 1 .. $opt{count};
            my $dt = time - $t0;
            $rate{$name} = $dt > 0 ? $opt{count} / $dt : 0;
        }
        $text = cmp_table(\%rate);
    } else {
        my $t = timethese(-$opt{seconds}, \%subs, 'none');
        my $rows = cmpthese($t, 'none');
        $text = join '', map { sprintf "%-10s" . (" %9s" x (@$_ - 1)) . "\n", @$_ } @$rows;
        for my $name (@names) {
            my $b = $t->{$name};
            my $cpu = $b->[1] + $b->[2];
            $rate{$name} = $cpu > 0 ? $b->[5] / $cpu : 0;
        }
    }
    print $text;
    for my $name (@names) {
        $result{"$ratio $size"}{$name}{blocks_per_s} = $rate{$name};
        $result{"$ratio $size"}{$name}{ops_per_s} = $rate{$name} * (1 + $gets);
        $result{"$ratio $size"}{$name}{misses} = ${ $result{"$ratio $size"}{$name}{misses} };
    }
    print "\nops/s (sets + gets): ",
        join(', ', map { sprintf '%s %.0f', $_, $result{"$ratio $size"}{$_}{ops_per_s} }
            sort { $rate{$a} <=> $rate{$b} } @names), "\n";
    push @tables, ["Benchmarking caches with ratio $ratio and $size values", $text];
    undef %objs;
}

# ---------------------------------------------------------------- goals

my @goals;
sub goal {
    my ($case, $mine, $theirs, $target) = @_;
    my $r = $result{$case} or return;
    return unless $r->{$mine} && $r->{$theirs} && $r->{$theirs}{ops_per_s};
    my $x = $r->{$mine}{ops_per_s} / $r->{$theirs}{ops_per_s};
    push @goals, sprintf '%-24s %-9s vs %-10s %6.2fx (goal >= %.1fx: %s)',
        $case, $mine, $theirs, $x, $target, $x >= $target ? 'met' : 'NOT met';
}
goal('1:10 medium', 'C:Near', 'C:FMmap', 8);
goal('1:10 medium', 'CHI:Near', 'CHI:Mem', 0.9);
goal('1:10 medium', 'CHI:Near', 'CHI:FMmap', 1.6);
print "\nGoals (ratios of ops/s within this run):\n", map {"  $_\n"} @goals if @goals;

# ---------------------------------------------------------------- seed 001

my @seed001;
if ($opt{seed001}) {
    # Seed 001's shape: N distinct keys stored in order (Set/s), then gets
    # of 85% stored / 15% never-stored keys (Get/s), then a mix of 15% sets
    # and 85% gets (Mix/s); GHitR/MHitR are the hit rates over gets of
    # stored keys. Values are binary strings of 147/465/1628 bytes on
    # average (the study's "Cmplx" column); the caches get 832 bytes per
    # key, so the largest values do not all fit, as in the study.
    my $n = 1500;
    my @k = map { uuid() } 1 .. $n;
    my @absent = map { uuid() } 1 .. $n / 2;
    print "\n# Seed 001 shape: Set/Get/Mix per second, hit rates (N = $n keys)\n";
    for my $name (@names) {
        my @rows;
        for my $avg (147, 465, 1628) {
            my @v = map { random_bytes(int($avg * (0.5 + rand))) } 1 .. $n;
            my @reps = map { seed001_once($name, $n, \@k, \@absent, \@v) } 1 .. $opt{repeats};
            push @rows, [$avg, map { my $i = $_; median(map { $_->[$i] } @reps) } 0 .. 4];
        }
        my $text = "Package: $name ($desc{$name})\nData type: bin\n"
            . " Cmplx |   Set/S |   Get/S |   Mix/S | GHitR | MHitR\n"
            . "-------|---------|---------|---------|-------|------\n"
            . join('', map { sprintf "%6d | %7.0f | %7.0f | %7.0f | %.3f | %.3f\n", @$_ } @rows);
        print "\n$text";
        push @seed001, [$name, $text, \@rows];
    }
}

# One fresh cache through the three phases: (set/s, get/s, mix/s, GHitR, MHitR).
sub seed001_once {
    my ($name, $n, $k, $absent, $v) = @_;
    my $c = ref $name ? $name : seed001_cache($name, $n * 832);
    my $t0 = time;
    $c->set($k->[$_], $v->[$_]) for 0 .. $n - 1;
    my $set_s = $n / (time - $t0);
    my $ops = 20_000;
    my @gk = map { rand() < 0.85 ? [1, $k->[rand $n]] : [0, $absent->[rand @$absent]] } 1 .. $ops;
    my ($gets, $hits) = (0, 0);
    $t0 = time;
    for my $g (@gk) {
        my $hit = defined $c->get($g->[1]);
        if ($g->[0]) { $gets++; $hits++ if $hit }
    }
    my $get_s = $ops / (time - $t0);
    my @mk = map { [rand() < 0.15 ? 2 : rand() < 0.85 ? 1 : 0, int rand $n] } 1 .. $ops;
    my ($mgets, $mhits) = (0, 0);
    $t0 = time;
    for my $m (@mk) {
        if ($m->[0] == 2) { $c->set($k->[$m->[1]], $v->[$m->[1]]) }
        elsif ($m->[0] == 1) { $mgets++; $mhits++ if defined $c->get($k->[$m->[1]]) }
        else { $c->get($absent->[$m->[1] % @$absent]) }
    }
    my $mix_s = $ops / (time - $t0);
    return [$set_s, $get_s, $mix_s, $gets ? $hits / $gets : 1, $mgets ? $mhits / $mgets : 1];
}

sub median {
    my @x = sort { $a <=> $b } @_;
    return @x % 2 ? $x[$#x / 2] : ($x[@x / 2 - 1] + $x[@x / 2]) / 2;
}

sub seed001_cache {
    my ($name, $bytes) = @_;
    my $size = int($bytes / 1024) . 'k';
    if ($name =~ /^C:Near/) {
        my $f = "$shm/bench-001-$$";
        push @cleanup_files, $f;
        return Cache::Near->new(share_file => $f, cache_size => $size, raw_values => 1, init_file => 1,
            recreate => 1);
    }
    if ($name eq 'CHI:Near') {
        my $f = "$shm/bench-001-chi-$$";
        push @cleanup_files, $f;
        unlink $f;
        return CHI->new(driver => 'Near', share_file => $f, cache_size => $size, namespace => 'b');
    }
    if ($name =~ /^C:FMmap/) {
        unlink "$dir/fm-001";
        return Cache::FastMmap->new(share_file => "$dir/fm-001", cache_size => $size,
            serializer => ($name eq 'C:FMmap' ? '' : 'storable'), init_file => 1);
    }
    if ($name eq 'CHI:FMmap') {
        my $d = tempdir(DIR => $dir);
        return CHI->new(driver => 'FastMmap', root_dir => $d, cache_size => $size);
    }
    if ($name eq 'CHI:Mem') {
        return CHI->new(driver => 'Memory', datastore => {}, max_size => $bytes);
    }
    if ($name eq 'C:Mc:F') {
        my $c = Cache::Memcached::Fast->new({ servers => ["127.0.0.1:$memcached_port"] });
        $c->flush_all;
        return $c;
    }
    if ($name eq 'CHI:Mc:F') {
        # CHI's memcached drivers cannot clear: a fresh namespace per run.
        return CHI->new(driver => 'Memcached::Fast', servers => ["127.0.0.1:$memcached_port"],
            namespace => 'b' . int(rand 1e9));
    }
    return $make{$name}->();
}

# ---------------------------------------------------------------- seed 001, complex data

# Seed 001's "complex" rows: hash refs of 5, 16 and 55 keys, frozen with
# Storable by every module (Cache::Near and Cache::FastMmap with
# serializer 'storable'; BerkeleyDB and the in-process baseline with
# Storable's nfreeze/thaw around a Berkeley DB hash and a Perl hash).
# Caches are the study's FastMmap geometry, 89 pages of 8 KiB (712 KiB),
# so the 55-key hashes do not all fit, as in the study. IPC::MM is not
# packaged by Debian: not run.
my @seed001c;
my %desc001c = (
    'Storable' => 'Storable freeze/thaw into an in-process hash (the study\'s baseline)',
    'C:Near:S' => 'Cache::Near, serializer storable, page_size 8192 x num_pages 89',
    'C:FMmap:S' => 'Cache::FastMmap, serializer storable, page_size 8192 x num_pages 89',
    'BerkeleyDB' => 'BerkeleyDB::Hash with Storable nfreeze/thaw, in a private environment',
);
my %skipped001c;
if ($opt{seed001}) {
    my $n = 1500;
    my @k = map { uuid() } 1 .. $n;
    my @absent = map { uuid() } 1 .. $n / 2;
    my $have_bdb = eval { require BerkeleyDB; 1 };
    $skipped001c{BerkeleyDB} = 'BerkeleyDB is not installed' unless $have_bdb;
    $skipped001c{'C:FMmap:S'} = 'Cache::FastMmap is not installed' unless $have{'Cache::FastMmap'};
    $skipped001c{'IPC::MM'} = 'not packaged by Debian';
    my @run = grep { !$skipped001c{$_} && (!$opt{only} || $opt{only} =~ /(?:^|,)\Q$_\E(?:,|$)/) }
        ('Storable', 'C:Near:S', 'C:FMmap:S', 'BerkeleyDB');
    print "\n# Seed 001 complex data: Set/Get/Mix per second, hit rates (N = $n keys, Storable)\n";
    for my $name (@run) {
        my @rows;
        for my $nkeys (5, 16, 55) {
            my @v = map { my $i = $_; +{ map { ("key$_" => random_text(8 + int rand 9)) } 1 .. $nkeys } } 1 .. $n;
            my @reps = map { seed001_once(seed001c_cache($name), $n, \@k, \@absent, \@v) } 1 .. $opt{repeats};
            push @rows, [$nkeys, map { my $i = $_; median(map { $_->[$i] } @reps) } 0 .. 4];
        }
        my $text = "Package: $name ($desc001c{$name})\nData type: complex\n"
            . " Cmplx |   Set/S |   Get/S |   Mix/S | GHitR | MHitR\n"
            . "-------|---------|---------|---------|-------|------\n"
            . join('', map { sprintf "%6d | %7.0f | %7.0f | %7.0f | %.3f | %.3f\n", @$_ } @rows);
        print "\n$text";
        push @seed001c, [$name, $text, \@rows];
    }
}

sub random_text { join '', map { chr(97 + int rand 26) } 1 .. $_[0] }

# A fresh store of seed 001's complex runs, as an object with get and set.
sub seed001c_cache {
    my ($name) = @_;
    if ($name eq 'Storable') {
        require Storable;
        return Seed001::Frozen->new;
    }
    if ($name eq 'C:Near:S') {
        my $f = "$shm/bench-001c-$$";
        push @cleanup_files, $f;
        return Cache::Near->new(share_file => $f, page_size => 8192, num_pages => 89, serializer => 'storable',
            init_file => 1, unlink_on_exit => 0);
    }
    if ($name eq 'C:FMmap:S') {
        unlink "$dir/fm-001c";
        return Cache::FastMmap->new(share_file => "$dir/fm-001c", page_size => 8192, num_pages => 89,
            serializer => 'storable', init_file => 1);
    }
    if ($name eq 'BerkeleyDB') {
        my $env_dir = tempdir(DIR => $dir);
        return Seed001::BDB->new($env_dir);
    }
    die "unknown seed 001 module $name";
}

package Seed001::Frozen;
sub new { return bless {}, shift }
sub set { $_[0]{ $_[1] } = Storable::nfreeze(\$_[2]); 1 }
sub get { my $f = $_[0]{ $_[1] }; return defined $f ? ${ Storable::thaw($f) } : undef }

package Seed001::BDB;
sub new {
    my ($class, $dir) = @_;
    require Storable;
    my $env = BerkeleyDB::Env->new(-Home => $dir, -Flags => BerkeleyDB::DB_CREATE() | BerkeleyDB::DB_INIT_MPOOL())
        or die "BerkeleyDB env: $BerkeleyDB::Error";
    my $db = BerkeleyDB::Hash->new(-Filename => "$dir/seed001.db", -Env => $env, -Flags => BerkeleyDB::DB_CREATE())
        or die "BerkeleyDB: $BerkeleyDB::Error";
    return bless { env => $env, db => $db }, $class;
}
sub set { $_[0]{db}->db_put($_[1], Storable::nfreeze(\$_[2])); 1 }
sub get {
    my $v;
    return $_[0]{db}->db_get($_[1], $v) == 0 ? ${ Storable::thaw($v) } : undef;
}

package main;

# ---------------------------------------------------------------- outputs

if ($opt{json}) {
    require JSON::PP;
    open my $fh, '>', $opt{json} or die "$opt{json}: $!";
    print $fh JSON::PP->new->canonical->pretty->encode({
        machine => \%machine, seed000 => \%result, goals => \@goals, skipped => \%skipped,
        seed001 => { map { ($_->[0] => $_->[2]) } @seed001 },
        seed001_complex => { map { ($_->[0] => $_->[2]) } @seed001c }, seed001_complex_skipped => \%skipped001c,
    });
}
if ($opt{markdown}) {
    open my $fh, '>', $opt{markdown} or die "$opt{markdown}: $!";
    print $fh "# Perl cache modules: seed 000 and seed 001 re-run in Perl\n\n";
    print $fh "Command: `$machine{command}`\n\n";
    print $fh "Machine: $machine{cpu}, $machine{cores} cores, $machine{os}; load average before: "
        . "$machine{load_before}, after: " . load() . "\n\n";
    print $fh "Versions: $machine{versions}\n\n";
    print $fh "Modules:\n\n", map({"- `$_`: $desc{$_}\n"} @names), "\n";
    print $fh "Not run: ", join('; ', map {"$_ ($skipped{$_})"} sort keys %skipped), "\n\n" if %skipped;
    print $fh "## Seed 000: set:get blocks (Benchmark::cmpthese, rates are blocks/s)\n\n";
    print $fh "One iteration is one set and N gets (1:N); 36-character UUID keys; "
        . "16/160/1600-byte random binary values.\n\n";
    for my $t (@tables) { print $fh "$t->[0]\n\n```\n$t->[1]```\n\n" }
    print $fh "Operations per second (sets + gets):\n\n| module | "
        . join(' | ', map {"$_->[0] $_->[1]"} @cases) . " |\n|---|" . ('---:|' x @cases) . "\n";
    for my $name (@names) {
        print $fh "| $name | "
            . join(' | ', map { sprintf '%.0f', $result{"$_->[0] $_->[1]"}{$name}{ops_per_s} || 0 } @cases) . " |\n";
    }
    print $fh "\nGoals (ratios within this run):\n\n```\n", map({"$_\n"} @goals), "```\n\n" if @goals;
    if (@seed001) {
        print $fh "## Seed 001 shape: Set/Get/Mix per second and hit rates\n\n";
        print $fh "Wall-clock rates (Time::HiRes), each the median of $opt{repeats} runs on a fresh cache; "
            . "1500 UUID keys, binary values of 147/465/1628 bytes on average, "
            . "caches of 832 bytes per key; gets are 85% stored / 15% never-stored keys, "
            . "the mix 15% sets / 85% gets.\n\n";
        print $fh "```\n$_->[1]```\n\n" for @seed001;
    }
    if (@seed001c) {
        print $fh "## Seed 001 complex data: Set/Get/Mix per second and hit rates\n\n";
        print $fh "As above, with values that are hash refs of 5/16/55 keys (8-16 letter values) "
            . "frozen with Storable; caches of 89 pages of 8 KiB (712 KiB), the study's FastMmap geometry. "
            . "Not run: " . join('; ', map {"$_ ($skipped001c{$_})"} sort keys %skipped001c) . ".\n\n";
        print $fh "```\n$_->[1]```\n\n" for @seed001c;
    }
}

# Benchmark::cmpthese's matrix from rates (for --count runs).
sub cmp_table {
    my ($rate) = @_;
    my @n = sort { $rate->{$a} <=> $rate->{$b} } grep { $rate->{$_} > 0 } keys %$rate;
    my @rows = (['', 'Rate', @n]);
    for my $x (@n) {
        push @rows, [$x, sprintf('%.0f/s', $rate->{$x}),
            map { $_ eq $x ? '--' : sprintf('%.0f%%', ($rate->{$x} / $rate->{$_} - 1) * 100) } @n];
    }
    return join '', map { sprintf "%-10s" . (" %9s" x (@$_ - 1)) . "\n", @$_ } @rows;
}

sub load {
    open my $fh, '<', '/proc/loadavg' or return '?';
    my @l = split ' ', scalar <$fh>;
    return "@l[0..2]";
}

sub machine {
    my %m;
    my @inc = grep { m{Cache-Near/blib} } @INC;
    $m{command} = join ' ', 'perl', (map {"-I$_"} @inc), $0, @ARGV_COPY::ARGV;
    $m{load_before} = load();
    if (open my $fh, '<', '/proc/cpuinfo') {
        while (<$fh>) { if (/^model name\s*:\s*(.*)/) { $m{cpu} = $1; last } }
    }
    $m{cpu} ||= 'unknown CPU';
    $m{cores} = `nproc 2>/dev/null` || '?';
    chomp $m{cores};
    $m{os} = join ' ', (POSIX::uname())[0, 2];
    my @v = ("perl $^V");
    for my $mod (qw(Cache::Near CHI Cache::FastMmap Cache::Memcached::Fast CHI::Driver::Memcached Storable BerkeleyDB)) {
        no strict 'refs';
        my $ver = ${"${mod}::VERSION"};
        push @v, "$mod $ver" if defined $ver;
    }
    if ($memcached_pid) {
        my ($mv) = `memcached -V 2>/dev/null` =~ /([\d.]+)/;
        push @v, "memcached $mv" if $mv;
    }
    $m{versions} = join ', ', @v;
    return %m;
}

BEGIN { @ARGV_COPY::ARGV = @ARGV }
