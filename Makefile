# Two entry points on a fresh machine (see README.md):
#   make demo   a Fashion-MNIST subset in S3 behind a latency proxy: train through shadefs and directly,
#               print the epoch times and cache figures side by side, write a PNG (a few minutes)
#   make demo FULL=1   the run over all 60,000 local training images instead
#   make test   run the test suite
# Both install what is missing first: Debian packages (fuse3, libfuse2, dataset-fashion-mnist, attr,
# redis-server and redis-tools for the shared tier's tests, rclone and s3fs for the peers' benchmark) and a virtual environment with this package,
# torch and torchvision.

PYTHON  ?= python3
VENV    ?= .venv
PY      := $(VENV)/bin/python
DATA    ?= data/fmnist
DEMO_DATA ?= data/fmnist-small
FULL    ?=
WORKDIR ?= /tmp/shadefs-demo
DEMO_ARGS ?=
APT_PKGS := fuse3 libfuse2 dataset-fashion-mnist attr redis-server redis-tools rclone s3fs
# another apt (unattended-upgrades on a fresh machine) may hold the dpkg lock: wait for it up to 10 minutes

.PHONY: demo test test-fast deps venv dataset bench clean

deps:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq && \
	    DEBIAN_FRONTEND=noninteractive $$SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq $$missing; \
	fi

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[torch,test]'
	touch $@

venv: $(VENV)/.installed

# the builder's marker lies beside the tree (data/fmnist.complete), never inside what gets mounted
$(DATA).complete: | deps venv
	$(PY) scripts/make_fashion_mnist.py $(DATA)

dataset: $(DATA).complete

# the default demo builds its small subset itself; FULL=1 needs the whole tree
demo: deps venv $(if $(FULL),dataset)
	$(PY) scripts/demo.py $(if $(FULL),--full --data $(DATA),--data $(DEMO_DATA)) --workdir $(WORKDIR) $(DEMO_ARGS)

test: deps venv
	$(PY) -m pytest tests -q

# the quick tier: in-process unit tests under a second each (about a minute); `make test` runs everything
test-fast: venv
	$(PY) -m pytest tests -q -m "unit and not slow"

# two benchmarks; `$(PY) -m shadefs.bench --list` names all of them (docs/benchmarks.md)
bench: deps venv dataset
	$(PY) -m shadefs.bench read
	$(PY) -m shadefs.bench hit_ratio --data $(DATA)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
