package CHI::t::Driver::Near::RootDir;

# CHI's own driver test suite again, with CHI::Driver::Near in its
# root_dir layout (a file per namespace, as CHI::Driver::FastMmap).

use strict;
use warnings;
use CHI::Test;
use base qw(CHI::t::Driver);

my ($root, $owner_pid);

sub testing_driver_class { 'CHI::Driver::Near' }

sub required_modules { return { 'Cache::Near' => undef } }

sub new_cache_options {
    my $self = shift;
    $owner_pid ||= $$;
    $root ||= Cache::Near->default_directory . "/chi-rootdir-test-$$-" . time;
    return ($self->SUPER::new_cache_options(), root_dir => $root, cache_size => '4m');
}

END {
    if ($root && $owner_pid == $$) {
        for my $f (glob "$root/*.dat") {
            unlink $f;
            Cache::Near::_remove_spill_dir($f);
        }
        rmdir $root;
    }
}

1;
