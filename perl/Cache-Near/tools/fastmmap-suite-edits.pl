# Edits tools/fastmmap-suite.pl makes to Cache::FastMmap's tests before
# running them against Cache::Near. Each is one of:
# - a documented difference (Cache::Near's POD, "Differences from
#   Cache::FastMmap"): the assertion is turned to nearcache's behaviour;
# - a test of FastMmap's internals, with no meaning for nearcache.
# %SKIP: whole files; %PATCH: file => [ [ regex, replacement, reason ] ].
# An edit that matches nothing fails the run (the suite changed).
our (%SKIP, %PATCH);

%SKIP = (
);

%PATCH = (
);

1;
