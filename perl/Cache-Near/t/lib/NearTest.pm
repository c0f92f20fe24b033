package NearTest;

# Helpers of the Cache::Near tests: a private cache file per test.

use strict;
use warnings;
use Exporter 'import';
use Cache::Near;

our @EXPORT_OK = qw(fresh_file fresh_cache);

my @files;

sub fresh_file {
    my ($tag) = @_;
    my $f = sprintf '%s/t-%s-%d-%d', Cache::Near->default_directory, $tag || 'x', $$, int rand 1e9;
    push @files, $f;
    return $f;
}

sub fresh_cache {
    my (%opt) = @_;
    return Cache::Near->new(share_file => fresh_file(), cache_size => '8m', %opt);
}

# Only in the process that loaded this module (not in forked children).
my $owner_pid = $$;

END {
    return unless $$ == $owner_pid;
    for my $f (grep { defined } @files) {
        unlink $f if -e $f;
        Cache::Near::_remove_spill_dir($f);
    }
}

1;
