# The few commands a contributor needs.
.PHONY: help deps build test check rust-test py-test bench bench-engine fmt lint clean

help:
	@echo "make deps        install Debian packages and the test extras; build and install nearcache (editable) unless a wheel is installed"
	@echo "make test        deps + the whole test suite (what CI runs)"
	@echo "make check       the whole test suite, without installing"
	@echo "make rust-test   cargo test for the engine"
	@echo "make py-test     pytest for the Python package"
	@echo "make bench       the benchmark harness (embedded default, no server needed)"
	@echo "make bench-engine criterion benchmarks of the engine"
	@echo "make fmt         format Rust and Python code"
	@echo "make lint        clippy, ruff, mypy"

deps:
	scripts/install-deps.sh

build:
	python3 -m pip install -q -e .

test: deps check

check:
	scripts/check.sh

rust-test:
	cargo test --workspace

py-test:
	python3 -m pytest -q tests/python

bench:
	nearcache bench

bench-engine:
	cargo bench -p nearcache-core --bench engine

fmt:
	cargo fmt --all
	ruff format python tests benchmarks
	ruff check --fix python tests benchmarks

lint:
	cargo clippy --workspace --all-targets -- -D warnings
	ruff check python tests benchmarks
	mypy

clean:
	cargo clean
	rm -rf .pytest_cache .mypy_cache .ruff_cache python/nearcache/*.so

# Perl binding (perl/Cache-Near): build and test it, and re-run seed 000/001 in Perl.
.PHONY: perl-test perl-bench
perl-test:
	scripts/test-perl.sh

perl-bench:
	cd perl/Cache-Near && perl Makefile.PL && $(MAKE)
	perl -Iperl/Cache-Near/blib/lib -Iperl/Cache-Near/blib/arch perl/bench/chi2010.pl --markdown perl/bench/results/chi2010.md --json perl/bench/results/chi2010.json
