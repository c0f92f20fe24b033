package CHI::t::Driver::Near::RootDir;

# CHI's test class of its FastMmap driver (CHI::t::Driver::FastMmap: the
# whole driver suite, with a root_dir per run) against CHI::Driver::Near,
# so that a switch from the FastMmap driver is judged by CHI's own
# expectations of it. Three of its tests read FastMmap specifics; they
# are restated here for Cache::Near, each difference with its reason. A
# fourth, of the driver suite, runs unchanged with the discard orders of
# the caches it builds pinned, which chance decided
# (CHI::t::Driver::Near::Subcaches).

use strict;
use warnings;
use CHI::Test;
use CHI::t::Driver::Near::Subcaches;
use File::Temp qw(tempdir);
use base qw(CHI::t::Driver::FastMmap);

sub testing_driver_class { 'CHI::Driver::Near' }

sub required_modules { return { 'Cache::Near' => undef } }

# CHI's, run with the discard orders of the caches it builds pinned (see
# Subcaches.pm: 'arbitrary' follows Cache::Near's per-file hash seed, and
# the Memory l1 cache's LRU ties go in Perl's hash order).
sub test_size_awareness_with_subcaches : Tests {
    CHI::t::Driver::Near::Subcaches::run(@_);
}

sub new_cache {
    my $self = shift;
    my @params = $self->{near_pin_discard} ? CHI::t::Driver::Near::Subcaches::pinned(@_) : @_;
    return $self->SUPER::new_cache(@params);
}

# As CHI's: fm_cache is the cache object, files are kept (unlink_on_exit
# 0), not emptied at exit, and CHI serializes (the cache does not).
sub test_fm_cache : Tests {
    my ($self) = @_;
    my $cache = $self->new_cache(root_dir => tempdir('chi-driver-near-XXXX', TMPDIR => 1, CLEANUP => 1));
    my $fm_cache = $cache->fm_cache;
    isa_ok($fm_cache, 'Cache::Near');
    is($fm_cache->{unlink_on_exit} || 0, 0, 'unlink_on_exit = 0 by default');
    is($fm_cache->{empty_on_exit} || 0, 0, 'empty_on_exit = 0 by default');
    is($fm_cache->{serializer}, '', "serializer '' (CHI serializes)");
}

# As CHI's, except that cache_size is kept exactly (FastMmap rounds 500k
# up to 9 pages of 64k, 589824 bytes); page_size x num_pages is FastMmap's.
sub test_parameter_passthrough : Tests {
    my ($self) = @_;
    my $cache = $self->new_cache(cache_size => '500k');
    is($cache->fm_cache->{cache_size}, 500 * 1024, 'cache_size parameter is passed to Cache::Near');
    $cache = $self->new_cache(page_size => 5000, num_pages => 11);
    is($cache->fm_cache->{cache_size}, 45056,
        'page_size and num_pages parameters are passed to Cache::Near (pages of 4096: FastMmap\'s rounding)');
}

# CHI's expects a value larger than a page to fail; Cache::Near stores it
# (no page limit), and fails only past max_value_size.
sub test_value_too_large : Tests {
    my ($self) = @_;
    my $cache = $self->new_cache(page_size => '4k', num_pages => 11, on_set_error => 'die');
    my %values = (small => 'x' x 3 x 1024, large => 'x' x 10 x 1024);
    $cache->set(small => $values{small});
    is($cache->get('small'), $values{small}, 'got small');
    lives_ok { $cache->set(large => $values{large}) } 'a value larger than a FastMmap page is stored';
    is($cache->get('large'), $values{large}, 'got large');
    my $limited = $self->new_cache(page_size => '4k', num_pages => 11, on_set_error => 'die', spill_budget => '64k');
    throws_ok { $limited->set(huge => 'x' x (100 * 1024)) } qr/error during cache set.*spill_budget/,
        'a value larger than max_value_size fails';
}

1;
