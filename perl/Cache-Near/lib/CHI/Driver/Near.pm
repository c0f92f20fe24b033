package CHI::Driver::Near;

# A CHI driver on Cache::Near. Two layouts:
# - share_file (the default): one shared-memory file holds every
#   namespace, each namespace's keys carrying its own prefix;
# - root_dir: one file per namespace in that directory, named as
#   CHI::Driver::FastMmap names them ("<escaped namespace>.dat"), so a
#   switch from the FastMmap driver keeps its options and layout.

use strict;
use warnings;
use Carp qw(croak);
use Cache::Near;
use File::Path qw(mkpath);
use File::Spec::Functions qw(catfile);
use Moo;

extends 'CHI::Driver';

our $VERSION = '0.2.0';

has 'root_dir'        => (is => 'ro');
has 'dir_create_mode' => (is => 'ro', default => sub { oct(775) });
has 'share_file'      => (is => 'ro', lazy => 1, builder => '_build_share_file');
has 'cache_size'      => (is => 'ro');
has 'page_size'       => (is => 'ro');
has 'num_pages'       => (is => 'ro');
has 'shards'          => (is => 'ro', default => sub { 0 });
has 'spill_threshold' => (is => 'ro');
has 'spill_budget'    => (is => 'ro');
has 'permissions'     => (is => 'ro');
has 'lock_timeout'    => (is => 'ro');
has 'near_cache'      => (is => 'ro', lazy => 1, builder => '_build_near_cache');
has '_prefix'         => (is => 'ro', lazy => 1, builder => '_build_prefix');

# Engine keys are at most 64 KiB of UTF-8; CHI digests longer keys.
has '+max_key_length' => (default => sub { 16 * 1024 });

# One Cache::Near per file, size and options in each process: CHI creates
# many driver objects, and they all share one mapping.
my %OPEN;

sub BUILD {
    my ($self) = @_;
    croak 'CHI::Driver::Near: give root_dir (a file per namespace) or share_file (one file), not both'
        if defined $self->root_dir && defined $self->{share_file};
    if (defined $self->root_dir && !-d $self->root_dir) {
        mkpath($self->root_dir, 0, $self->dir_create_mode);
    }
    return;
}

sub _build_share_file {
    my ($self) = @_;
    return catfile($self->root_dir, $self->escape_for_filename($self->namespace) . '.dat')
        if defined $self->root_dir;
    return Cache::Near->default_directory . "/chi-$<.cache";
}

sub _build_near_cache {
    my ($self) = @_;
    my %opt = map { defined $self->$_ ? ($_ => $self->$_) : () }
        qw(cache_size page_size num_pages spill_threshold spill_budget permissions lock_timeout);
    $opt{cache_size} = '64m' unless grep { defined $opt{$_} } qw(cache_size page_size num_pages);
    my $id = join "\0", $self->share_file, $self->shards, map({ ($_, $opt{$_}) } sort keys %opt), $$;
    return $OPEN{$id} ||= Cache::Near->new(
        share_file     => $self->share_file,
        shards         => $self->shards,
        serializer     => '',
        unlink_on_exit => 0,
        # A namespace's own file opened with another size is made anew, as
        # Cache::FastMmap re-initialises it under the FastMmap driver.
        (defined $self->root_dir ? (recreate => 1) : ()),
        %opt,
    );
}

# As CHI::Driver::FastMmap: the Cache::Near object.
sub fm_cache { $_[0]->near_cache }

# "chi<length>:<namespace>|": unambiguous for any namespace, and never a
# prefix of another namespace's prefix. A file of its own needs none.
sub _build_prefix {
    my ($self) = @_;
    return '' if defined $self->root_dir;
    my $ns = $self->namespace;
    return 'chi' . length($ns) . ":$ns|";
}

sub fetch {
    my ($self, $key) = @_;
    return $self->near_cache->get($self->_prefix . $key);
}

sub store {
    my ($self, $key, $data) = @_;
    if (my $batch = $self->{_near_batch}) {
        push @$batch, $self->_prefix . $key, $data;
        return;
    }
    $self->near_cache->set($self->_prefix . $key, $data);
    return;
}

sub remove {
    my ($self, $key) = @_;
    $self->near_cache->remove($self->_prefix . $key);
    return;
}

sub clear {
    my ($self) = @_;
    my $prefix = $self->_prefix;
    return $self->near_cache->clear if $prefix eq '';
    my @mine = grep { index($_, $prefix) == 0 } $self->near_cache->get_keys(0);
    $self->near_cache->multi_remove(\@mine) if @mine;
    return;
}

sub get_keys {
    my ($self) = @_;
    my $prefix = $self->_prefix;
    my $n = length $prefix;
    return map { substr $_, $n } grep { index($_, $prefix) == 0 } $self->near_cache->get_keys(0);
}

sub get_namespaces {
    my ($self) = @_;
    if (defined $self->root_dir) {
        opendir my $dh, $self->root_dir or return;
        my @files = grep { /\.dat\z/ && -f catfile($self->root_dir, $_) } readdir $dh;
        closedir $dh;
        return map { $self->unescape_for_filename(substr $_, 0, -4) } @files;
    }
    my %seen;
    for my $key ($self->near_cache->get_keys(0)) {
        next unless $key =~ /\Achi([0-9]+):/;
        my $ns = substr $key, length($1) + 4, $1;
        $seen{$ns} = 1 if substr($key, length($1) + 4 + $1, 1) eq '|';
    }
    return keys %seen;
}

sub fetch_multi_hashref {
    my ($self, $keys) = @_;
    my $prefix = $self->_prefix;
    my $n = length $prefix;
    my $got = $self->near_cache->multi_get([ map { $prefix . $_ } @$keys ]);
    return { map { substr($_, $n) => $got->{$_} } keys %$got };
}

# CHI's store_multi sets each key (building its cache objects); the
# stores are collected and written with one engine call, one lock hold
# per shard.
sub store_multi {
    my ($self, @args) = @_;
    return $self->SUPER::store_multi(@args) if $self->{_near_batch};
    local $self->{_near_batch} = [];
    $self->SUPER::store_multi(@args);
    my $batch = $self->{_near_batch};
    $self->near_cache->multi_set({@$batch}) if @$batch;
    return;
}

1;

__END__

=head1 NAME

CHI::Driver::Near - CHI driver for Cache::Near (nearcache's shared-memory engine)

=head1 SYNOPSIS

  use CHI;
  my $cache = CHI->new(
      driver     => 'Near',
      share_file => '/dev/shm/myapp-chi.cache',
      cache_size => '256m',
      namespace  => 'sessions',
  );
  $cache->set($key, $data, '10 minutes');
  my $data = $cache->get($key);

=head1 DESCRIPTION

Stores CHI's entries in L<Cache::Near> files shared by every process of
the machine, in one of two layouts:

=over

=item One file (C<share_file>, the default)

All namespaces live in the same file, each under its own key prefix, so
C<get_namespaces> lists them and C<clear> removes one namespace's entries
only.

=item A file per namespace (C<root_dir>)

As L<CHI::Driver::FastMmap>: each namespace has its own file in
C<root_dir>, named C<E<lt>escaped namespaceE<gt>.dat>; C<get_namespaces>
lists the directory. Switching from the FastMmap driver keeps its
C<root_dir>, C<page_size>, C<num_pages> and C<cache_size> options.

=back

=head1 CONSTRUCTOR OPTIONS

=over

=item share_file

The one cache file (default C</dev/shm/nearcache-$UID/chi-$UID.cache>).

=item root_dir

A directory with a file per namespace, as L<CHI::Driver::FastMmap> (which
defaults to C<chi-driver-fastmmap> in the temporary directory; this driver
uses the one file unless C<root_dir> is given). Created if missing.

=item dir_create_mode

Mode of C<root_dir> when it is created (default 0775, as the FastMmap
driver).

=item cache_size, page_size, num_pages

Size of each file: C<cache_size> (e.g. C<256m>, kept exactly), or C<page_size> x
C<num_pages> as L<Cache::FastMmap> computes it (default C<64m>). With
C<share_file> every process must use the same size (another size
croaks); with C<root_dir> a namespace's file opened with another size is
made anew (its entries lost), as Cache::FastMmap re-initialises it under
the FastMmap driver.

=item permissions, lock_timeout

As for L<Cache::Near>.

=item shards

Shard count (power of two); 0 chooses from the size.

=item spill_threshold, spill_budget

As for L<Cache::Near>: values longer than C<spill_threshold> (default
C<128k>) are kept in files beside the cache file, which hold at most
C<spill_budget> bytes (default C<1g>; C<0> keeps every value in the
shared file, so a value too large for a shard is an error).

=back

=head1 METHODS

=over

=item near_cache, fm_cache

The L<Cache::Near> object (C<fm_cache> as in the FastMmap driver).

=back

Expiry is CHI's: entries carry their expiry time in CHI's metadata, and
the engine evicts with SIEVE when the file is full.

=head1 SEE ALSO

L<CHI>, L<Cache::Near>.

=cut
