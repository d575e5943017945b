# Sourced by the sample tests that run a sample on 1 process, then on 2 under
# redco-run. tests/meson.build always passes the launcher, so the 2-process
# part runs wherever redco can run ranks as processes. Where it cannot (redco
# built without UCX: the Deployer then fails saying so), the test ends in SKIP
# (exit 77) with that reason, after the rest of it has passed, rather than in a
# pass the 2-process part did not earn.

# skip_without_ucx <output of a 2-process run that failed>: exits 77 when it
# failed for want of UCX; returns otherwise, for the caller to report a FAIL.
skip_without_ucx() {
  grep -q 'redco was built without UCX' <<<"$1" || return 0
  echo "SKIP: redco was built without UCX (libucx-dev), which runs ranks as processes:" \
    "the 2-process part cannot run (the rest passed)"
  exit 77
}
