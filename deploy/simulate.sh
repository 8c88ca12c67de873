#!/usr/bin/env bash
# Builds the image and runs the compose simulation, checking what it leaves:
#  1. the README's quickstart (deploy/quickstart.sh) as typed, twice: five owners,
#     a study that seals at five, the user's outputs in ./compose-out (components,
#     synthetic rows in the input's header, study.json with every row and owner
#     counted); the rerun a new study that every owner joins;
#  2. faults, on a study with public bounds and a given C (the user-one-study
#     service, so that nothing runs before it): two owners contribute, the proxy
#     container is killed (SIGKILL) and
#     started again, the status still lists both (no acknowledged contribution
#     lost); owner-05, started while the proxy is down, is killed before it can
#     send; owners 3 and 4 come, and the study
#     seals at its quorum of four with owner-05 named missing and exactly the
#     rows of owners 1-4 counted.
# Needs cargo and a Docker engine with docker-compose (or the compose plugin); pulls
# no image. Leaves the outputs in compose-out/ (or DPCA_OUT).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

. deploy/compose.sh
export DPCA_UID="${DPCA_UID:-$(id -u)}" DPCA_GID="${DPCA_GID:-$(id -g)}"
export DPCA_OUT="${DPCA_OUT:-$root/compose-out}"
export COMPOSE_PROJECT_NAME="${COMPOSE_PROJECT_NAME:-dpca-simulation}"

fail() {
    echo "SIMULATION FAILED: $*" >&2
    compose ps >&2 || true
    compose logs --no-color --tail=30 >&2 || true
    # Again last, where a log's tail shows it.
    echo "SIMULATION FAILED: $*" >&2
    exit 1
}
cleanup() { compose --profile tools --profile faults down -v --remove-orphans >/dev/null 2>&1 || true; }
trap 'cleanup; typed_cleanup' EXIT

# The field of the first study in the operator's status (JSON), via the tools profile.
status_json() {
    compose run --rm -T operator /bin/proxy status --json \
        --proxy=https://proxy:50051 --tls-cert=/pki/operator.pem \
        --tls-key=/pki/operator.key 2>/dev/null
}
owners_in() {
    status_json | python3 -c 'import json,sys; s=json.load(sys.stdin)["studies"]; print(",".join(sorted(s[0]["owners_in"])) if s else "")'
}
# Waits for a one-shot service to exit and prints its exit code.
exit_code() {
    local id
    id="$(compose ps -q "$1")"
    [ -n "$id" ] || fail "no container for $1"
    docker wait "$id"
}
wait_healthy() {
    for _ in $(seq 1 60); do
        [ "$(docker inspect -f '{{.State.Health.Status}}' "$(compose ps -q proxy)")" = healthy ] && return 0
        sleep 1
    done
    fail "the proxy did not become healthy"
}
check_json() {
    python3 -c 'import json, sys
d = json.load(open(sys.argv[2]))
assert eval(sys.argv[1]), {k: d.get(k) for k in ("n_rows", "n_owners", "owners_missing")}' \
        "$1" "$DPCA_OUT/study.json" || fail "study.json: $1"
}

t0=$(date +%s)
deploy/build-image.sh
compose build --quiet 2>/dev/null || true

echo "== 1. the quickstart as the README types it, then a rerun (a new study)"
# As a new user runs it: none of this script's settings, the default project and
# output folder (./compose-out, which is also DPCA_OUT here).
typed() { (unset DPCA_OUT COMPOSE_PROJECT_NAME DPCA_UID DPCA_GID; "$@"); }
typed_cleanup() { typed compose --profile tools down -v --remove-orphans >/dev/null 2>&1 || true; }
typed_cleanup
rm -rf "$root/compose-out"
typed deploy/quickstart.sh || fail "the quickstart failed"
for f in components.csv eigenvalues.csv scatter.csv study.json synthetic.csv report.html; do
    [ -s "$DPCA_OUT/$f" ] || fail "no $f in $DPCA_OUT"
done
check_json "d['n_rows'] == 5620 and d['n_owners'] == 5 and d['owners_missing'] == []"
check_json "d['trust']['masked']"
[ "$(head -n 1 "$DPCA_OUT/synthetic.csv")" = "$(head -n 1 data/optdigits.csv)" ] \
    || fail "synthetic.csv does not have the input's header"
[ "$(wc -l <"$DPCA_OUT/synthetic.csv")" = 5621 ] || fail "synthetic.csv is not 5620 rows"
# The synthetic digits look like digits: their pixels spread within a factor 2 of
# the real ones' (grey digits do not), and a nearest-centroid classifier fitted to
# them labels the real rows at least 85% as well as one fitted to the real rows
# (python/examples/optdigits.py checks the same call with logistic regression).
python3 - "$DPCA_OUT/synthetic.csv" data/optdigits.csv <<'PY' || fail "the synthetic digits are not usable"
import csv, math, sys
def read(path):
    rows = list(csv.reader(open(path)))[1:]
    return [[float(x) for x in r[:-1]] for r in rows], [r[-1] for r in rows]
(sx, sy), (rx, ry) = read(sys.argv[1]), read(sys.argv[2])
def spread(xs):
    cells = [v for r in xs for v in r]
    m = sum(cells) / len(cells)
    return math.sqrt(sum((v - m) ** 2 for v in cells) / len(cells))
def centroids(xs, ys):
    acc = {}
    for x, y in zip(xs, ys):
        s, n = acc.get(y, ([0.0] * len(x), 0))
        acc[y] = ([a + b for a, b in zip(s, x)], n + 1)
    return {y: [a / n for a in s] for y, (s, n) in acc.items()}
def accuracy(c):
    near = lambda x: min(c, key=lambda y: sum((a - b) ** 2 for a, b in zip(x, c[y])))
    return sum(near(x) == y for x, y in zip(rx, ry)) / len(rx)
ratio, share = spread(sx) / spread(rx), accuracy(centroids(sx, sy)) / accuracy(centroids(rx, ry))
print(f"synthetic digits: pixel spread {ratio:.2f} of the real; nearest-centroid accuracy {share:.2f} of the real rows'")
assert 0.5 <= ratio <= 2 and share >= 0.85
PY
first="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["study_id"])' "$DPCA_OUT/study.json")"
echo "ok: 5620 rows from 5 owners, outputs as expected"
typed deploy/quickstart.sh || fail "the rerun of the quickstart failed"
check_json "d['n_rows'] == 5620 and d['n_owners'] == 5 and d['study_id'] != '$first'"
echo "ok: the rerun was a new study, with every owner"
typed_cleanup

echo "== 2. faults: the proxy killed and restarted, an owner killed mid-study"
cleanup
rm -rf "$DPCA_OUT" && mkdir -p "$DPCA_OUT"
export DPCA_QUORUM=4
# One study (public bounds, C given), so the faults fall in the study itself.
compose --profile faults up -d setup-data proxy user-one-study
[ "$(exit_code setup-data)" = 0 ] || fail "the owners' slices were not written"
wait_healthy
for _ in $(seq 1 120); do
    [ -n "$(status_json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["studies"]) or "")')" ] && break
    sleep 1
done
compose up -d --no-deps owner-01 owner-02
[ "$(exit_code owner-01)" = 0 ] && [ "$(exit_code owner-02)" = 0 ] || fail "owners 1 and 2 failed"
before="$(owners_in)"
[ "$before" = "owner-01,owner-02" ] || fail "before the restart the proxy counts '$before'"
compose kill -s SIGKILL proxy
# owner-05 starts while the proxy is down: it encrypts its share, finds no proxy and
# keeps retrying (--retry-for 300), so it is still running when it is killed a
# second later, whatever the machine's speed, and never sends anything. (Killing it
# a fixed 0.2 s after start raced its encryption.)
compose up --no-start --no-deps owner-05
o5="$(compose ps -q owner-05)"
docker start "$o5" >/dev/null
sleep 1
[ "$(docker inspect -f '{{.State.Running}}' "$o5")" = true ] \
    || fail "owner-05 stopped by itself while the proxy was down: $(docker logs "$o5" 2>&1 | tail -n 3)"
docker kill -s KILL "$o5" >/dev/null
compose start proxy
wait_healthy
after="$(owners_in)"
[ "$after" = "$before" ] || fail "after the restart the proxy counts '$after', not '$before'"
echo "ok: the proxy restarted with $after counted; owner-05 killed while it was down"
compose up -d --no-deps owner-03 owner-04
[ "$(exit_code user-one-study)" = 0 ] || fail "the user did not finish after the faults"
[ "$(exit_code owner-05)" = 137 ] || fail "owner-05 was not killed"
for i in 03 04; do [ "$(exit_code owner-$i)" = 0 ] || fail "owner-$i failed"; done
# Owners 1-4 hold 1124 rows each (5620 split five ways).
check_json "d['n_rows'] == 4496 and d['n_owners'] == 4 and d['owners_missing'] == ['owner-05']"
echo "ok: sealed at the quorum of 4, owner-05 missing, 4496 rows counted"
# Read whole before it is searched: `grep -q` stops reading at its match, and the
# writer's broken pipe would fail the pipeline under pipefail.
page="$(compose exec -T proxy /bin/proxy metrics --from 9100)" || fail "the proxy did not print its metrics page"
case "$page" in
    *'dpca_contributions_total{outcome="counted"} 2'*) ;;
    *) fail "the metrics do not count the two contributions since the restart: $(grep dpca_contributions_total <<<"$page")" ;;
esac
proxy_ip="$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}' "$(compose ps -q proxy)" | awk '{print $1}')"
# From another container on the study network the port is closed (the command
# runs, and says the connection was refused).
outside="$(compose run -T --rm --no-deps operator /bin/proxy metrics --from "$proxy_ip:9100" 2>&1 || true)"
case "$outside" in
    *"cannot read the metrics page"*"refused"*) ;;
    *) fail "the metrics page is not closed to the study network ($proxy_ip:9100): $outside" ;;
esac
echo "ok: the metrics count them, on the proxy's loopback only"
echo "simulation passed in $(($(date +%s) - t0)) s; outputs in $DPCA_OUT"
