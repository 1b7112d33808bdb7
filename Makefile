.PHONY: test test-matrix demo bench soak kernel-client images tools cluster-up cluster-down release-check help

# Every test: tools, fmt, clippy, unit tests and end-to-end tests on a local control plane.
test:
	hack/test.sh

# Every test on the oldest supported Kubernetes and the newest as well (KUBERNETES_MATRIX in
# hack/versions.env; `make test` runs the pinned one): hack/test-matrix.sh.
test-matrix:
	hack/test-matrix.sh

# The demo: controller + three HA agents over simulated DRBD nodes, through a node failure.
demo:
	hack/demo.sh

# End-to-end figures against the bare floor, full size, on a fresh control plane (docs/explanation/performance.md).
bench:
	hack/with-cluster.sh cargo bench --locked --bench scale

# The seeded fault soak on a control plane of its own: SOAK_SECONDS long (default 300), faults
# in the order SOAK_SEED draws (printed, so that a run replays).
SOAK_SECONDS ?= 300
soak:
	SOAK_SECONDS=$(SOAK_SECONDS) hack/with-cluster.sh cargo test --locked --test soak -- --include-ignored --nocapture

# The Linux kernel's NFS client (Debian's cloud kernel under qemu) through a planned move and a
# node loss, printing what it saw: KERNEL_PACKAGE=linux-image-<version> picks the kernel (default:
# linux-image-cloud-amd64's), SVC_GANESHA_TEMPLATE=FILE a ganesha template of your own (the install
# guide's placeholders; default: the guide's).
kernel-client:
	SVC_NODE_MONITOR_GRACE_PERIOD=8s SVC_NODE_MONITOR_PERIOD=1s hack/with-cluster.sh cargo test --locked --test datapath -- \
	  --include-ignored --nocapture --exact the_kernels_nfs_client_keeps_its_locks_and_writes_across_moves

# The pinned Kubernetes parts, etcd, helm and helm-docs, built once into the tools cache.
tools:
	hack/tools.sh

# Whether VERSION (default: Cargo.toml's) can be released from this tree, short of pushing
# (hack/release-check.sh). The release workflow runs it with RELEASE_TAG=1.
release-check:
	PATH="$$(hack/tools.sh --release):$$PATH" hack/release-check.sh $(VERSION)

# A local control plane to try things by hand (KUBECONFIG is printed), and its removal.
cluster-up:
	hack/cluster.sh up

# Stops the control plane cluster-up started and removes what it wrote.
cluster-down:
	hack/cluster.sh down

# Both images (controller, agent) for every platform in PLATFORMS (default: this machine's alone),
# tagged VERSION and pushed to REGISTRY with docker buildx: `make images
# REGISTRY=registry.example.com/storage`. More platforms (PLATFORMS=linux/amd64,linux/arm64) need
# builders for them or QEMU's binfmt handlers on the Docker host. The chart's defaults name
# ghcr.io/shared-volume-controller/shared-volume-{controller,agent} (hack/release.env), where the
# release workflow pushes them.
REGISTRY ?= $(shell sed -n 's/^IMAGE_PREFIX=//p' hack/release.env)
VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
SOURCE ?= $(shell git remote get-url origin 2>/dev/null || echo unknown)
PLATFORMS ?= linux/$(shell uname -m | sed 's/x86_64/amd64/; s/aarch64/arm64/')
PUSH ?= --push
images:
	for image in controller:shared-volume-controller agent:shared-volume-agent; do \
	  docker buildx build --platform $(PLATFORMS) --target $${image%%:*} --build-arg REVISION=$(REVISION) \
	    --label org.opencontainers.image.title=$${image#*:} --label org.opencontainers.image.version=$(VERSION) \
	    --label org.opencontainers.image.revision=$(REVISION) --label org.opencontainers.image.source=$(SOURCE) \
	    -t $(REGISTRY)/$${image#*:}:$(VERSION) $(PUSH) . || exit 1; \
	done

# Each target with the first sentence of the comment above it: this list.
help:
	@awk '/^# /{said = said " " substr($$0, 3); next} /^$$/{said = ""} /^[a-z][a-z-]*:/{sub(/:.*/, ""); line = said; sub(/^ /, "", line); sub(/\. .*/, ".", line); printf "  make %-14s %s\n", $$0, line; said = ""}' $(MAKEFILE_LIST)
