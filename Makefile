.PHONY: test demo tools cluster-up cluster-down

# Every test: tools, fmt, clippy, unit tests and end-to-end tests on a local control plane.
test:
	hack/test.sh

# The demo: controller + three HA agents over simulated DRBD nodes, through a node failure.
demo:
	hack/demo.sh

tools:
	hack/tools.sh

cluster-up:
	hack/cluster.sh up

cluster-down:
	hack/cluster.sh down
