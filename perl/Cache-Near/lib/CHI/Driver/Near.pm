package CHI::Driver::Near;

# A CHI driver on Cache::Near: one shared-memory file holds every
# namespace, each namespace's keys carrying its own prefix.

use strict;
use warnings;
use Carp qw(croak);
use Cache::Near;
use Moo;

extends 'CHI::Driver';

our $VERSION = '0.1.0';

has 'share_file' => (is => 'ro', lazy => 1, builder => '_build_share_file');
has 'cache_size' => (is => 'ro', default => sub { '64m' });
has 'shards'     => (is => 'ro', default => sub { 0 });
has 'spill_threshold' => (is => 'ro');
has 'spill_budget'    => (is => 'ro');
has 'near_cache' => (is => 'ro', lazy => 1, builder => '_build_near_cache');
has '_prefix'    => (is => 'ro', lazy => 1, builder => '_build_prefix');

# Engine keys are at most 64 KiB of UTF-8; CHI digests longer keys.
has '+max_key_length' => (default => sub { 16 * 1024 });

# One Cache::Near per file, size and spill options in each process: CHI
# creates many driver objects, and they all share one mapping.
my %OPEN;

sub _build_share_file {
    return Cache::Near->default_directory . "/chi-$<.cache";
}

sub _build_near_cache {
    my ($self) = @_;
    my %spill = map { defined $self->$_ ? ($_ => $self->$_) : () } qw(spill_threshold spill_budget);
    my $id = join "\0", $self->share_file, $self->cache_size, $self->shards,
        map({ defined $_ ? $_ : '' } $spill{spill_threshold}, $spill{spill_budget}), $$;
    return $OPEN{$id} ||= Cache::Near->new(
        share_file     => $self->share_file,
        cache_size     => $self->cache_size,
        shards         => $self->shards,
        raw_values     => 1,
        unlink_on_exit => 0,
        %spill,
    );
}

# "chi<length>:<namespace>|": unambiguous for any namespace, and never a
# prefix of another namespace's prefix.
sub _build_prefix {
    my ($self) = @_;
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

Stores CHI's entries in one L<Cache::Near> file shared by every process
of the machine. All namespaces live in the same file, each under its own
key prefix, so C<get_namespaces> lists them and C<clear> removes one
namespace's entries only.

=head1 CONSTRUCTOR OPTIONS

=over

=item share_file

The cache file (default C</dev/shm/nearcache-$UID/chi-$UID.cache>).

=item cache_size

Total size of the file, e.g. C<256m> (default C<64m>). Every process must
use the same size for the same file.

=item shards

Shard count (power of two); 0 chooses from the size.

=item spill_threshold, spill_budget

As for L<Cache::Near>: values longer than C<spill_threshold> (default
C<128k>) are kept in files beside the cache file, which hold at most
C<spill_budget> bytes (default C<1g>; C<0> keeps every value in the
shared file, so a value too large for a shard is an error).

=back

Expiry is CHI's: entries carry their expiry time in CHI's metadata, and
the engine evicts with SIEVE when the file is full.

=head1 SEE ALSO

L<CHI>, L<Cache::Near>.

=cut
