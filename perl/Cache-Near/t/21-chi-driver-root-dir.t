# CHI's test class of its FastMmap driver (the driver suite in the root_dir
# layout, a file per namespace, plus FastMmap's own expectations) against
# CHI::Driver::Near. AUTHOR_TESTING=1 adds
# CHI's multi-process and timing tests.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;

BEGIN {
    # CHI::Test first: it sets up Log::Any::Test, which must precede any other Log::Any use.
    for my $m (qw(CHI::Test CHI CHI::t::Driver CHI::t::Driver::FastMmap Cache::FastMmap Test::Class Test::Deep Test::Exception Test::Warn)) {
        next if eval "require $m; 1";
        $ENV{NEARCACHE_REQUIRE_CHI} ? BAIL_OUT("$m is required: $@") : plan(skip_all => "$m is not installed");
    }
}

use CHI::t::Driver::Near::RootDir;
CHI::t::Driver::Near::RootDir->runtests;
