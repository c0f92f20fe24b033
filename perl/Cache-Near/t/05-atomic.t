# get_and_set and get_and_remove are atomic across processes (the
# engine's compare-and-swap): processes that increment one counter with
# get_and_set lose no increment, readers never see the key missing while
# it is swapped, and every value taken by get_and_remove is taken once.
#
# NEARCACHE_RACE_PROCS, NEARCACHE_RACE_INCREMENTS and NEARCACHE_RACE_RUNS
# scale it (defaults 4 x 2,000, 3 runs, to stay fast); the figures in
# docs/perl.md come from
#   NEARCACHE_RACE_INCREMENTS=10000 NEARCACHE_RACE_RUNS=20 prove -b t/05-atomic.t
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use POSIX qw(_exit);
use NearTest qw(fresh_file);
use Cache::Near;

my $procs = $ENV{NEARCACHE_RACE_PROCS} || 4;
my $increments = $ENV{NEARCACHE_RACE_INCREMENTS} || 2000;
my $runs = $ENV{NEARCACHE_RACE_RUNS} || 3;

ok(Cache::Near::HAVE_CAS(), 'built on the engine\'s compare-and-swap')
    or diag 'the C ABI has no nc_cas: get_and_set falls back to a compare-and-delete, which is not atomic';

# Run $code in $n children (given their number); returns their exit codes.
sub in_children {
    my ($n, $code) = @_;
    my @pids;
    for my $child (1 .. $n) {
        my $pid = fork;
        die "fork: $!" unless defined $pid;
        if (!$pid) {
            my $status = eval { $code->($child); 1 } ? 0 : do { print STDERR "child $child: $@"; 1 };
            _exit($status);
        }
        push @pids, $pid;
    }
    return map { waitpid($_, 0); $? >> 8 } @pids;
}

my $file = fresh_file('atomic');
for my $serializer ('', 'storable') {
    my $cache = Cache::Near->new(share_file => $file, cache_size => '8m', serializer => $serializer,
        unlink_on_exit => 0);
    my @totals;
    for my $run (1 .. $runs) {
        $cache->set(counter => 0);
        my @exit = in_children($procs, sub {
            my $own = Cache::Near->new(share_file => $file, cache_size => '8m', serializer => $serializer);
            $own->get_and_set(counter => sub { $_[1] + 1 }) for 1 .. $increments;
        });
        is_deeply(\@exit, [ (0) x $procs ], "run $run: the children finished") or last;
        push @totals, $cache->get('counter');
    }
    is_deeply(\@totals, [ ($procs * $increments) x @totals ],
        "serializer '$serializer': $procs processes x $increments get_and_set increments end at "
        . $procs * $increments . " in each of $runs runs")
        or diag "totals: @totals";
}

{
    # A reader never finds the counter missing while writers swap it.
    my $cache = Cache::Near->new(share_file => $file, cache_size => '8m', serializer => '', unlink_on_exit => 0);
    $cache->set(counter => 0);
    my $misses_file = "$file.misses";
    my @exit = in_children(3, sub {
        my ($child) = @_;
        my $own = Cache::Near->new(share_file => $file, cache_size => '8m', serializer => '');
        if ($child == 3) {
            my $misses = 0;
            for (1 .. 4 * $increments) { $misses++ unless defined $own->get('counter') }
            open my $fh, '>', $misses_file or die $!;
            print {$fh} $misses;
            close $fh;
            return;
        }
        $own->get_and_set(counter => sub { $_[1] + 1 }) for 1 .. $increments;
    });
    is_deeply(\@exit, [0, 0, 0], 'writers and reader finished');
    open my $fh, '<', $misses_file or die $!;
    my $misses = <$fh>;
    close $fh;
    unlink $misses_file;
    is($misses, 0, 'the reader never saw the key missing during the swaps');
    is($cache->get('counter'), 2 * $increments, '... and no increment was lost');
}

{
    # get_and_remove takes each value exactly once: one process puts
    # 1..n under one key (each only once the last was taken), two take.
    my $cache = Cache::Near->new(share_file => $file, cache_size => '8m', serializer => '', unlink_on_exit => 0);
    my $n = $increments;
    my $taken_dir = "$file.taken";
    mkdir $taken_dir;
    my @exit = in_children(3, sub {
        my ($child) = @_;
        my $own = Cache::Near->new(share_file => $file, cache_size => '8m', serializer => '');
        if ($child == 1) {
            for my $i (1 .. $n) { 1 until $own->add(item => $i) }
            $own->set(done => 1);
            return;
        }
        my @taken;
        my $idle = 0;
        while ($idle < 2) {
            my ($v, $removed) = $own->get_and_remove('item');
            if ($removed) { push @taken, $v; next }
            $idle++ if $own->get('done');
        }
        open my $fh, '>', "$taken_dir/$child" or die $!;
        print {$fh} join(',', @taken);
        close $fh;
    });
    is_deeply(\@exit, [0, 0, 0], 'the putter and the takers finished');
    my %seen;
    my $dups = 0;
    for my $f (glob "$taken_dir/*") {
        open my $fh, '<', $f or die $!;
        my $line = <$fh>;
        close $fh;
        unlink $f;
        for (grep { length } split /,/, defined $line ? $line : '') { $dups++ if $seen{$_}++ }
    }
    rmdir $taken_dir;
    is($dups, 0, 'no value was taken twice by get_and_remove');
    is(scalar(keys %seen), $n, "... and all $n were taken");
}

unlink $file;
Cache::Near::_remove_spill_dir($file);
done_testing;
