#!/usr/bin/env perl
# Run Cache::FastMmap's own test suite (its t/*.t) against Cache::Near.
#
#   perl tools/fastmmap-suite.pl [--source DIR|TARBALL] [--raw] [--json FILE]
#
# The suite is never part of this distribution: it is taken from
# Cache::FastMmap's source, given with --source (or FASTMMAP_SOURCE), or
# downloaded from Debian's archive (the source package
# libcache-fastmmap-perl of the release apt knows) into a temporary
# directory. Every "Cache::FastMmap" becomes "Cache::Near"; then the
# edits of %PATCH below are applied: each is a documented difference
# (see "Differences from Cache::FastMmap" in Cache::Near's POD) or a
# test of FastMmap's internals, with its reason. --raw skips the edits
# (to measure the suite as a switching user would first run it).
#
# Prints one line per file and a summary "N passed, N failed" of files;
# exits 1 if a file that is expected to pass fails. Run from the
# distribution directory after `make` (it uses blib/).
use strict;
use warnings;
use Cwd qw(abs_path getcwd);
use File::Basename qw(basename);
use File::Copy qw(copy);
use File::Temp qw(tempdir);
use Getopt::Long;
use TAP::Harness;
use TAP::Parser::Aggregator;

my %opt = (source => $ENV{FASTMMAP_SOURCE});
GetOptions(\%opt, 'source=s', 'raw', 'json=s', 'keep') or die "usage: $0 [--source DIR|TARBALL] [--raw] [--json FILE]\n";

my $dist = getcwd;
-d "$dist/blib/lib" or die "Run `perl Makefile.PL && make` first (no blib/ in $dist)\n";
my $work = tempdir('fastmmap-suite-XXXXXX', TMPDIR => 1, CLEANUP => !$opt{keep});

# --------------------------------------------------------------- the source

sub fetch_from_debian {
    my ($into) = @_;
    # A private apt configuration with a deb-src line for the suite apt
    # already uses, so the machine's own sources are left alone.
    my ($uris, $suite) = apt_origin();
    my $etc = "$into/apt";
    mkdir $etc;
    mkdir "$etc/$_" for qw(lists lists/partial cache cache/archives cache/archives/partial);
    open my $fh, '>', "$etc/sources.list" or die $!;
    print {$fh} "deb-src $uris $suite main\n";
    close $fh;
    my @apt = ('apt-get', '-q', '-o', "Dir::Etc::SourceList=$etc/sources.list", '-o', 'Dir::Etc::SourceParts=/nonexistent',
        '-o', "Dir::State::Lists=$etc/lists", '-o', "Dir::Cache=$etc/cache", '-o', 'APT::Sandbox::User=root');
    system(@apt, 'update') == 0 or return "apt-get update (deb-src $uris $suite) failed";
    my $pwd = getcwd;
    chdir $into or die $!;
    my $ok = system(@apt, 'source', '--download-only', 'libcache-fastmmap-perl') == 0;
    chdir $pwd;
    return 'apt-get source libcache-fastmmap-perl failed (is the source tarball on the mirror?)' unless $ok;
    my ($orig) = glob "$into/libcache-fastmmap-perl_*.orig.tar.*";
    return 'no .orig tarball downloaded' unless $orig;
    return unpack_tarball($orig, $into);
}

sub apt_origin {
    my ($uris, $suite) = ('http://deb.debian.org/debian', 'bookworm');
    for my $f (glob('/etc/apt/sources.list.d/*.sources'), '/etc/apt/sources.list') {
        open my $fh, '<', $f or next;
        local $/;
        my $text = <$fh>;
        if ($text =~ m{^URIs:\s*(\S+/debian)\s*$}m) {
            $uris = $1;
            ($suite) = $text =~ /^Suites:\s*(\S+)/m if $text =~ /^Suites:/m;
            last;
        }
        if ($text =~ m{^deb\s+(?:\[[^\]]*\]\s+)?(\S+/debian)\s+(\S+)}m) { ($uris, $suite) = ($1, $2); last }
    }
    return ($uris, $suite);
}

sub unpack_tarball {
    my ($tarball, $into) = @_;
    system('tar', '-xf', $tarball, '-C', $into) == 0 or return "cannot unpack $tarball";
    my ($dir) = grep { -d "$_/t" } glob "$into/*";
    return $dir ? \$dir : "no t/ in $tarball";
}

my $src;
if (defined $opt{source}) {
    my $given = abs_path($opt{source}) or die "--source $opt{source}: no such file or directory\n";
    my $got = -d $given ? \$given : unpack_tarball($given, $work);
    ref $got or die "$got\n";
    $src = $$got;
} else {
    my $got = fetch_from_debian($work);
    unless (ref $got) {
        print "Cache::FastMmap's suite: skipped: $got\n";
        exit($ENV{NEARCACHE_REQUIRE_FASTMMAP_SUITE} ? 1 : 0);
    }
    $src = $$got;
}
my $version = 'unknown';
if (open my $fh, '<', "$src/lib/Cache/FastMmap.pm") {
    while (<$fh>) { if (/\$VERSION\s*=\s*'?([0-9._]+)/) { $version = $1; last } }
}

# --------------------------------------------------------------- the edits

our (%SKIP, %PATCH);
do "$dist/tools/fastmmap-suite-edits.pl" or die "tools/fastmmap-suite-edits.pl: " . ($@ || $!) . "\n"
    unless $opt{raw};

my $tdir = "$work/t";
mkdir $tdir;
my (@files, %skipped, %unmatched);
for my $path (sort { (basename($a) =~ /(\d+)/)[0] <=> (basename($b) =~ /(\d+)/)[0] } glob "$src/t/*.t") {
    my $name = basename($path);
    if (my $why = $SKIP{$name}) { $skipped{$name} = $why; next }
    open my $in, '<', $path or die "$path: $!";
    my $code = do { local $/; <$in> };
    close $in;
    $code =~ s/Cache::FastMmap/Cache::Near/g;
    for my $edit (@{ $PATCH{$name} || [] }) {
        my ($from, $to, $why) = @$edit;
        # The replacement is literal text, or code given the matched text.
        my $n = ($code =~ s/$from/ref $to eq 'CODE' ? $to->($&) : $to/ge);
        # Versions of the suite differ: an edit that finds nothing is
        # reported; if the test then fails, the run shows it.
        push @{ $unmatched{$name} }, $why unless $n;
    }
    open my $out, '>', "$tdir/$name" or die $!;
    print {$out} $code;
    close $out;
    push @files, "$tdir/$name";
}

# --------------------------------------------------------------- the run

my $harness = TAP::Harness->new({
    lib       => [ "$dist/blib/lib", "$dist/blib/arch" ],
    verbosity => -1,
    timer     => 0,
    merge     => 1,
    exec      => sub { my (undef, $file) = @_; return [ $^X, '-w', "-I$dist/blib/lib", "-I$dist/blib/arch", $file ] },
});
my $chdir = getcwd;
chdir $tdir;
my $agg = $harness->runtests(@files);
chdir $chdir;

my ($files_ok, $files_bad, $asserts_run, $asserts_ok, $planned) = (0, 0, 0, 0, 0);
my @rows;
for my $file (@files) {
    my ($parser) = $agg->parsers($file);
    my $name = basename($file);
    my $ok = !$parser->has_problems && ($parser->tests_planned || 0) == $parser->tests_run;
    $ok ? $files_ok++ : $files_bad++;
    $asserts_run += $parser->tests_run;
    $asserts_ok += scalar $parser->passed;
    $planned += $parser->tests_planned || $parser->tests_run;
    push @rows, sprintf '%-6s %-4s %4d/%-4d assertions passed%s', $name, ($ok ? 'ok' : 'FAIL'),
        scalar $parser->passed, $parser->tests_planned || $parser->tests_run,
        ($parser->exit ? ' (exit ' . $parser->exit . ')' : '') . ($parser->skip_all ? ' (skipped: ' . $parser->skip_all . ')' : '');
}
print "Cache::FastMmap ${version}'s own suite against Cache::Near", ($opt{raw} ? ' (unedited)' : ''), ":\n";
print "  $_\n" for @rows;
print "  $_ skipped: $skipped{$_}\n" for sort keys %skipped;
for my $name (sort keys %unmatched) { print "  $name: no match for the edit: $_\n" for @{ $unmatched{$name} } }
printf "  files: %d of %d passed; assertions: %d of %d planned passed (%d run)\n",
    $files_ok, scalar @files, $asserts_ok, $planned, $asserts_run;
if ($opt{json}) {
    require JSON::PP;
    open my $j, '>', $opt{json} or die $!;
    print {$j} JSON::PP->new->canonical->pretty->encode({
        fastmmap_version => $version, edited => $opt{raw} ? 0 : 1, files_passed => $files_ok,
        files_run => scalar @files, assertions_passed => $asserts_ok, assertions_planned => $planned,
        assertions_run => $asserts_run, files => \@rows, skipped => \%skipped });
}
print "$files_ok passed, $files_bad failed, " . scalar(keys %skipped) . " skipped\n";
exit($files_bad && !$opt{raw} ? 1 : 0);
