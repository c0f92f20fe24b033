# Cache::FastMmap's own test suite against Cache::Near, with the reasoned
# edits of tools/fastmmap-suite-edits.pl: every file must pass. The suite
# is not part of this distribution: set FASTMMAP_SOURCE to a
# Cache::FastMmap source tree or tarball, or NEARCACHE_FASTMMAP_SUITE=1 to
# download Debian's source package of libcache-fastmmap-perl (apt-get).
use strict;
use warnings;
use Test::More;

plan skip_all => 'set FASTMMAP_SOURCE (a Cache::FastMmap source) or NEARCACHE_FASTMMAP_SUITE=1 (download it)'
    unless $ENV{FASTMMAP_SOURCE} || $ENV{NEARCACHE_FASTMMAP_SUITE};
my $out = `"$^X" tools/fastmmap-suite.pl 2>&1`;
my $status = $? >> 8;
diag $out if $status || $ENV{TEST_VERBOSE};
if ($out =~ /^Cache::FastMmap's suite: skipped: (.*)$/m) {
    plan skip_all => "Cache::FastMmap's source could not be had: $1" unless $ENV{NEARCACHE_REQUIRE_FASTMMAP_SUITE};
    fail("Cache::FastMmap's source could not be had: $1");
    done_testing;
    exit;
}
my ($passed, $failed) = $out =~ /^(\d+) passed, (\d+) failed/m;
ok(defined $passed, 'the suite ran') or diag $out;
is($status, 0, 'tools/fastmmap-suite.pl succeeded');
is($failed, 0, "every file passed ($passed passed)");
note $_ for grep { /files: |skipped: / } split /\n/, $out;
done_testing;
