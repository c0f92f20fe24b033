# A get that races a writer may be handed a buffer for the value and then
# find the key gone (the optimistic read retried and missed): the buffer
# must be freed. One process sets and removes a 120 KB value while this
# one reads it; the reader's memory must not grow with the misses (before
# the fix it grew by one value per such race: 2.4 and 4.3 MB in two runs,
# against 0 and 240 kB with it).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use POSIX qw(_exit WNOHANG);
use Time::HiRes qw(time);
use NearTest qw(fresh_file);
use Cache::Near;

plan skip_all => 'needs /proc/self/status' unless -r "/proc/$$/status";

sub rss_kb {
    open my $fh, '<', "/proc/$$/status" or die $!;
    while (<$fh>) { return $1 if /^VmRSS:\s+(\d+) kB/ }
    die 'no VmRSS';
}

my $file = fresh_file('getleak');
my $cache = Cache::Near->new(share_file => $file, cache_size => '8m', serializer => '', unlink_on_exit => 0);
my $value = 'x' x (120 * 1024);
ok(length($value) <= $cache->spill_threshold, 'the value is kept inline (the raced path)');
my $pid = fork;
die "fork: $!" unless defined $pid;
if (!$pid) {
    my $w = Cache::Near->new(share_file => $file, cache_size => '8m', serializer => '');
    my $until = time + 3;
    while (time < $until) { $w->set(k => $value); $w->remove('k') }
    _exit(0);
}
my ($hits, $misses, $base) = (0, 0, undef);
while (waitpid($pid, WNOHANG) == 0) {
    defined $cache->get('k') ? $hits++ : $misses++;
    $base = rss_kb() if !defined $base && $hits + $misses == 20_000;
}
$base = rss_kb() unless defined $base;
my $growth = rss_kb() - $base;
cmp_ok($hits, '>', 0, "the reader saw the value ($hits hits, $misses misses)");
cmp_ok($growth, '<', 1024, "the reader's memory did not grow with the misses ($growth kB)");
done_testing;
