.PHONY: test demo bench tools cluster-up cluster-down

# Every test: tools, fmt, clippy, unit tests and end-to-end tests on a local control plane.
test:
	hack/test.sh

# The demo: controller + three HA agents over simulated DRBD nodes, through a node failure.
demo:
	hack/demo.sh

# End-to-end figures against the bare floor, full size, on a fresh control plane (see README).
bench:
	hack/with-cluster.sh cargo bench --locked --bench scale

tools:
	hack/tools.sh

cluster-up:
	hack/cluster.sh up

cluster-down:
	hack/cluster.sh down
