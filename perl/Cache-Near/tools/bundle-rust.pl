#!/usr/bin/env perl
# Put the Rust engine into a distribution directory, so that the tarball
# builds with Perl, a C compiler and cargo alone, offline:
#
#   perl tools/bundle-rust.pl DISTDIR        (run by `make dist`)
#
# DISTDIR/rust/ gets a two-crate workspace (nearcache-core and
# nearcache-ffi, as in the nearcache source tree, without their tests and
# benchmarks), its Cargo.lock, the crates.io dependencies it needs
# (`cargo vendor`, into rust/vendor/) and a .cargo/config.toml that points
# cargo at them. The files are added to DISTDIR/MANIFEST.
#
# NEARCACHE_SOURCE: the nearcache source tree (default: two levels up).
# CARGO: cargo (default: cargo on PATH).
use strict;
use warnings;
use Cwd qw(abs_path getcwd);
use File::Copy qw(copy);
use File::Find qw(find);
use File::Path qw(mkpath rmtree);
use File::Spec::Functions qw(catdir catfile abs2rel updir);

my $dist = shift or die "usage: $0 DISTDIR\n";
-d $dist or die "$dist is not a directory\n";
$dist = abs_path($dist);
my $source = abs_path($ENV{NEARCACHE_SOURCE} || catdir(updir, updir));
-f catfile($source, 'crates', 'nearcache-ffi', 'Cargo.toml')
    or die "Cannot find crates/nearcache-ffi under $source: set NEARCACHE_SOURCE\n";
my $cargo = $ENV{CARGO} || 'cargo';

my $rust = catdir($dist, 'rust');
rmtree($rust);
mkpath($rust);

sub slurp { my ($f) = @_; open my $fh, '<', $f or die "$f: $!\n"; local $/; return scalar <$fh> }
sub spew { my ($f, $text) = @_; open my $fh, '>', $f or die "$f: $!\n"; print {$fh} $text; close $fh or die "$f: $!\n" }

# The sections of a TOML file, by header ('' for the part before the first).
sub sections {
    my ($text) = @_;
    my (@out, $name, $body) = ();
    ($name, $body) = ('', '');
    for my $line (split /^/, $text) {
        if ($line =~ /^\[\[?([^\]]+)\]\]?\s*$/) {
            push @out, [ $name, $body ];
            ($name, $body) = ($1, $line);
        } else {
            $body .= $line;
        }
    }
    push @out, [ $name, $body ];
    return @out;
}

# The workspace: its package defaults and release profile, two members.
my %root = map { $_->[0] => $_->[1] } sections(slurp(catfile($source, 'Cargo.toml')));
spew(catfile($rust, 'Cargo.toml'), join '',
    "# The Rust engine of Cache::Near, copied from the nearcache source tree by\n",
    "# tools/bundle-rust.pl; Makefile.PL builds nearcache-ffi from it.\n",
    "[workspace]\nresolver = \"2\"\nmembers = [\"nearcache-core\", \"nearcache-ffi\"]\n\n",
    $root{'workspace.package'} || die("no [workspace.package] in Cargo.toml\n"),
    $root{'profile.release'} || '');

# The crates: manifests without dev-dependencies, tests, benches and
# examples (not shipped), sources, and the C header.
my %skip = map { $_ => 1 } qw(dev-dependencies bench test example);
for my $crate (qw(nearcache-core nearcache-ffi)) {
    my $from = catdir($source, 'crates', $crate);
    my $to = catdir($rust, $crate);
    mkpath($to);
    my $manifest = join '', map { $skip{ $_->[0] } ? () : $_->[1] } sections(slurp(catfile($from, 'Cargo.toml')));
    $manifest =~ s{path = "\.\./}{path = "../}g;
    spew(catfile($to, 'Cargo.toml'), $manifest);
    for my $dir (grep { -d catdir($from, $_) } qw(src include)) {
        find({ no_chdir => 1, wanted => sub {
            return unless -f $_;
            my $rel = abs2rel($_, $from);
            mkpath(catdir($to, (File::Spec->splitpath($rel))[1]));
            copy($_, catfile($to, $rel)) or die "copy $_: $!\n";
        } }, catdir($from, $dir));
    }
}
copy(catfile($source, 'Cargo.lock'), catfile($rust, 'Cargo.lock')) or die "Cargo.lock: $!\n";

# The dependencies, vendored; cargo prunes the lock file to this workspace.
my $cwd = getcwd;
chdir $rust or die $!;
my $config = `"$cargo" vendor --versioned-dirs --manifest-path Cargo.toml vendor`;
$? == 0 or die "cargo vendor failed\n";
chdir $cwd;
mkpath(catdir($rust, '.cargo'));
spew(catfile($rust, '.cargo', 'config.toml'), "# Written by tools/bundle-rust.pl: build from rust/vendor, offline.\n$config");

# List them in the distribution's MANIFEST.
my @files;
find({ no_chdir => 1, wanted => sub { push @files, abs2rel($_, $dist) if -f $_ } }, $rust);
open my $mf, '>>', catfile($dist, 'MANIFEST') or die "MANIFEST: $!\n";
print {$mf} "$_\n" for sort @files;
close $mf;
printf "bundled the Rust engine into %s: %d files\n", abs2rel($rust, $cwd), scalar @files;
