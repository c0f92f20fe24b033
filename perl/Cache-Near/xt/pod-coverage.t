# Author test: every public method of Cache::Near and CHI::Driver::Near is
# documented (private ones start with an underscore; CHI's driver methods
# are documented by CHI::Driver).
use strict;
use warnings;
use Test::More;
eval { require Test::Pod::Coverage; Test::Pod::Coverage->VERSION(1.08); 1 }
    or plan skip_all => 'Test::Pod::Coverage 1.08 is needed';
plan tests => 2;
Test::Pod::Coverage::pod_coverage_ok('Cache::Near', {
    # Perl's own hooks, and the constants of the flags word.
    also_private => [ qr/\A(?:DESTROY|CLONE_SKIP|HAVE_CAS|MIN_SIZE|SERIALIZER_CUSTOM)\z/, qr/\A(?:FLAG|COMPRESSION|SERIALIZER|NATIVE|RESERVED|SIGNATURE|FASTMMAP)_/ ],
});
SKIP: {
    skip 'CHI is not installed', 1 unless eval { require CHI::Driver; 1 };
    Test::Pod::Coverage::pod_coverage_ok('CHI::Driver::Near', {
        # The CHI::Driver interface (documented there), and Moo's BUILD.
        also_private => [ qr/\A(?:BUILD|max_key_length|fetch|store|remove|clear|get_keys|get_namespaces|fetch_multi_hashref|store_multi)\z/ ],
    });
}
