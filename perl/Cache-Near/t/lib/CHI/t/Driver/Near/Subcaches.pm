package CHI::t::Driver::Near::Subcaches;

# CHI's test_size_awareness_with_subcaches, restated for CHI::Driver::Near.
#
# CHI's test sets key0..key19 into a cache with a size-aware Memory l1
# cache and expects the l1 cache to keep three to five keys (59 to 99 of
# its 99 bytes). Both discard orders in it are left to chance: the Memory
# l1 cache's 'lru' sorts by last fetch time, in whole seconds and unset for
# keys never fetched (all of them here), so ties go in Perl's randomised
# hash order; and a size-aware main cache discards in its 'arbitrary'
# order, get_keys' order, which for Cache::Near follows each file's random
# hash seed (a key the main cache discards leaves the l1 cache too). A
# rare order leaves the l1 cache two keys (40 bytes): the suite failed so
# once, after many passing runs. The expectations are CHI's; only the
# discard orders are pinned here, to the order the test set its keys (what
# LRU gives when nothing is read), so that the test checks the subcache
# logic it was written for, every run.

use strict;
use warnings;
use CHI::Test;
use CHI::Test::Util qw(is_between);

sub in_set_order {
    my ($cache) = @_;
    my @keys = sort { ($a =~ /(\d+)\z/)[0] <=> ($b =~ /(\d+)\z/)[0] } $cache->get_keys;
    return sub { shift @keys };
}

sub run {
    my ($self) = @_;
    my ($cache, $l1_cache);
    my $set_values = sub {
        my $value_20 = 'x' x 6;
        for (my $i = 0; $i < 20; $i++) {
            $cache->set("key$i", $value_20);
        }
        $l1_cache = $cache->l1_cache;
    };
    my $is_size_aware = sub {
        my $c     = shift;
        my $label = $c->label;
        ok($c->is_size_aware, "$label is size aware");
        my $max_size = $c->max_size;
        ok($max_size > 0, "$label has max size");
        is_between($c->get_size, $max_size - 40, $max_size, "$label size = " . $c->get_size);
        is_between(
            scalar($c->get_keys),
            ($max_size + 1) / 20 - 2,
            ($max_size + 1) / 20,
            "$label keys = " . scalar($c->get_keys)
        );
    };
    my $is_not_size_aware = sub {
        my $c     = shift;
        my $label = $c->label;
        ok(!$c->is_size_aware, "$label is not size aware");
        is($c->get_keys, 20, "$label keys = 20");
    };

    my %l1 = (driver => 'Memory', datastore => {}, max_size => 99, discard_policy => \&in_set_order);
    $cache = $self->new_cleared_cache(l1_cache => {%l1});
    $set_values->();
    $is_not_size_aware->($cache);
    $is_size_aware->($l1_cache);

    $cache = $self->new_cleared_cache(
        l1_cache       => {%l1},
        max_size       => 199,
        discard_policy => \&in_set_order,
    );
    $set_values->();
    $is_size_aware->($cache);
    $is_size_aware->($l1_cache);

    $cache = $self->new_cleared_cache(
        l1_cache       => { driver => 'Memory', datastore => {} },
        max_size       => 199,
        discard_policy => \&in_set_order,
    );
    $set_values->();
    $is_size_aware->($cache);
    ok(!$l1_cache->is_size_aware, $l1_cache->label . " is not size aware");
    return;
}

1;
