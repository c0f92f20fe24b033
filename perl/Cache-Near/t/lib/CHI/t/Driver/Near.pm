package CHI::t::Driver::Near;

# CHI's own driver test suite (CHI::t::Driver), run against CHI::Driver::Near.

use strict;
use warnings;
use CHI::Test;
use CHI::t::Driver::Near::Subcaches;
use base qw(CHI::t::Driver);

my ($share_file, $owner_pid);
our @ROOTS;

sub required_modules { return { 'Cache::Near' => undef } }

sub new_cache_options {
    my $self = shift;
    $owner_pid ||= $$;
    $share_file ||= Cache::Near->default_directory . "/chi-test-$$-" . time . '.cache';
    return ($self->SUPER::new_cache_options(), share_file => $share_file, cache_size => '32m');
}

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

sub test_near_cache_is_shared_by_namespaces : Tests {
    my ($self) = @_;
    my $a = $self->new_cache(namespace => 'near-a');
    my $b = $self->new_cache(namespace => 'near-b');
    isa_ok($a->near_cache, 'Cache::Near');
    is($a->near_cache, $b->near_cache, 'one Cache::Near per file in a process');
    $a->set(k => 'from a');
    $b->set(k => 'from b');
    is($a->get('k'), 'from a', 'namespace a keeps its value');
    is($b->get('k'), 'from b', 'namespace b keeps its value');
    $a->clear;
    ok(!defined $a->get('k'), 'clear empties namespace a');
    is($b->get('k'), 'from b', '... and leaves namespace b alone');
}

sub test_value_too_large : Tests {
    my ($self) = @_;
    my $cache = $self->new_cache(namespace => 'near-large', on_set_error => 'die');
    my $max = $cache->near_cache->max_entry_size;
    $cache->set(small => 'x' x 1024);
    my $large = 'y' x ($max + 1);
    lives_ok { $cache->set(large => $large) } 'a value larger than a shard is stored ...';
    ok($cache->get('large') eq $large, '... in a file beside the cache, and read back');
    $cache->remove('large');

    my $budget = $self->new_cache(namespace => 'near-large', on_set_error => 'die', spill_budget => '2m');
    is($budget->near_cache->max_value_size, 2 << 20, 'spill_budget is passed to Cache::Near');
    throws_ok { $budget->set(small => 'z' x (3 << 20)) }
        qr/error during cache set.*exceeds the \d+-byte spill budget.*spill_budget/,
        'a value larger than the spill budget croaks';
    is($budget->get('small'), 'x' x 1024, 'the cache is unchanged');

    my $inline = $self->new_cache(namespace => 'near-large', on_set_error => 'die', spill_budget => 0);
    throws_ok { $inline->set(small => 'x' x ($max + 1)) } qr/error during cache set.*exceeds.*entry limit/,
        'with spill_budget => 0 a value larger than a shard croaks';
    is($inline->get('small'), 'x' x 1024, 'the cache is unchanged');
}

sub test_root_dir_is_a_file_per_namespace : Tests {
    my ($self) = @_;
    my $root = Cache::Near->default_directory . "/chi-root-$$-" . int(rand 1e9);
    push @ROOTS, $root;
    my %common = (driver => 'Near', root_dir => $root, page_size => '16k', num_pages => 13);
    my $a = CHI->new(%common, namespace => 'one/a');
    my $b = CHI->new(%common, namespace => 'two');
    $a->set(k => 'from a');
    $b->set(k => 'from b');
    ok(-f "$root/one+2fa.dat", 'namespace one/a has its own file, named as CHI::Driver::FastMmap names it')
        or diag join ' ', glob "$root/*";
    ok(-f "$root/two.dat", 'namespace two has its own file');
    is($a->get('k'), 'from a', 'namespace a keeps its value');
    is($b->get('k'), 'from b', 'namespace b keeps its value');
    is_deeply([ sort $a->get_namespaces ], [ 'one/a', 'two' ], 'get_namespaces lists the files');
    is($a->near_cache->{page_size}, 16384, 'page_size is passed to Cache::Near');
    is($a->near_cache->{cache_size}, 13 * 16384, '... and so is num_pages: the file holds page_size x num_pages');
    is($a->fm_cache, $a->near_cache, 'fm_cache, as in the FastMmap driver');
    $a->clear;
    ok(!defined $a->get('k'), 'clear empties namespace a');
    is($b->get('k'), 'from b', '... and leaves namespace b alone');
    throws_ok { CHI->new(driver => 'Near', root_dir => $root, share_file => "$root/x") }
        qr/root_dir .* or share_file .* not both/, 'root_dir and share_file exclude each other';
}


# Only in the process that made the file: CHI's multi-process tests fork
# children, which run END blocks too when they exit.
END {
    if ($owner_pid && $owner_pid == $$) {
        for my $root (@ROOTS) {
            unlink glob "$root/*.dat";
            rmdir $root;
        }
    }
    if ($share_file && $owner_pid == $$) {
        unlink $share_file;
        Cache::Near::_remove_spill_dir($share_file);
    }
}

1;
