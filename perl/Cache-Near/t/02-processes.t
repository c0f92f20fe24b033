# Many processes on one file: forked writers, and a writer killed with
# SIGKILL in the middle of a write (the engine repairs the shard).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use POSIX qw(_exit);
use Time::HiRes qw(time sleep);
use NearTest qw(fresh_file);
use Cache::Near;

my $file = fresh_file('proc');
my $cache = Cache::Near->new(share_file => $file, cache_size => '8m');

subtest 'forked children write, the parent reads' => sub {
    my @pids;
    for my $child (1 .. 4) {
        my $pid = fork;
        die "fork: $!" unless defined $pid;
        if (!$pid) {
            # The inherited object works in the child, and so does a new one.
            my $own = Cache::Near->new(share_file => $file, cache_size => '8m');
            for my $i (1 .. 500) {
                $cache->set("c$child-$i", "v$child-$i");
                $own->incr('shared-counter');
            }
            _exit(0);
        }
        push @pids, $pid;
    }
    waitpid $_, 0 for @pids;
    is($?, 0, 'children exited cleanly');
    my @bad = grep { my ($c, $i) = @$_; ($cache->get("c$c-$i") // '') ne "v$c-$i" }
        map { my $c = $_; map { [$c, $_] } 1 .. 500 } 1 .. 4;
    is(scalar @bad, 0, 'every value written by a child is there');
    is($cache->get('shared-counter'), 2000, 'incr is atomic across processes');
    ok(-e $file, 'children did not remove the file');
};

subtest 'kill -9 of a writer in the middle of a write' => sub {
    $cache->set(victim => 'before');
    $cache->set(bystander => 'kept');
    pipe my $r, my $w or die "pipe: $!";
    my $pid = fork;
    die "fork: $!" unless defined $pid;
    if (!$pid) {
        close $r;
        my $c = Cache::Near->new(share_file => $file, cache_size => '8m');
        syswrite $w, "locked\n";
        # Locks victim's shard, leaves it half-written, sleeps until killed.
        $c->_debug_hold_shard_mid_write('victim', 60_000);
        _exit(0);
    }
    close $w;
    is(scalar <$r>, "locked\n", 'the child is about to hold the lock');
    sleep 0.3;
    kill 'KILL', $pid;
    waitpid $pid, 0;
    is($? & 127, 9, 'the child died of SIGKILL');
    my $t0 = time;
    my $v = $cache->get('victim');
    cmp_ok(time - $t0, '<', 5, 'the next caller is not wedged');
    ok(!defined $v || $v eq 'before', 'no torn value: the shard was reset or the value kept');
    my $stats = $cache->stats;
    cmp_ok($stats->{resets} + $stats->{salvages}, '>=', 1,
        'the engine repaired the dead writer\'s shard (salvaged or reset)');
    is($cache->get('bystander'), 'kept', 'a salvage keeps the complete entries') if $stats->{salvages};
    $cache->set(victim => 'again');
    is($cache->get('victim'), 'again', 'the shard works after recovery');
    is($cache->check->{repaired_shards}, 0, 'check finds nothing left to repair');
};

done_testing;
