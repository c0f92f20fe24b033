# Author test: the POD of every module parses cleanly.
use strict;
use warnings;
use Test::More;
eval { require Test::Pod; Test::Pod->VERSION(1.41); 1 } or plan skip_all => 'Test::Pod 1.41 is needed';
Test::Pod::all_pod_files_ok(Test::Pod::all_pod_files('lib'));
