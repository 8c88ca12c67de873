#!/usr/bin/env bash
# The containers' quickstart: builds the image (deploy/build-image.sh), runs the
# study of docker-compose.yml (a proxy, a data user and five owners), waits for the
# user to write its outputs to ./compose-out (DPCA_OUT), then stops the containers
# and says where the outputs are. Exits non-zero, with the log of the role that
# failed, if the user or an owner fails.
#
# A rerun is a new study at the same proxy with the same owners: their budgets
# (a cap of epsilon 3; a run spends 1, which their ledgers add up as about 1.4
# over its three studies) carry over, as in a deployment, so the third run is
# refused by the owners' caps. `docker-compose down -v` forgets
# everything (certificates, slices, the proxy's state and the budgets).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

. deploy/compose.sh
owners="owner-01 owner-02 owner-03 owner-04 owner-05"

deploy/build-image.sh
compose up -d
echo "the study runs; waiting for the user (docker-compose logs -f shows every role)"

# The exit code of a service's container, empty while it runs.
exited() {
    local id
    id="$(compose ps -q "$1")"
    [ -n "$id" ] || return 0
    [ "$(docker inspect -f '{{.State.Running}}' "$id")" = false ] &&
        docker inspect -f '{{.State.ExitCode}}' "$id"
    return 0
}
failed() {
    echo "$1 failed (exit $2); its log:" >&2
    compose logs --no-color --tail=20 "$1" >&2
    compose stop >/dev/null 2>&1 || true
    exit 1
}

while :; do
    code="$(exited user)"
    [ -z "$code" ] || break
    # An owner that fails (its budget spent, say) leaves the study short: say so
    # now rather than wait for the study's deadline.
    for o in $owners; do
        c="$(exited "$o")"
        [ -z "$c" ] || [ "$c" = 0 ] || failed "$o" "$c"
    done
    sleep 2
done
[ "$code" = 0 ] || failed user "$code"
# The user's summary: what was chosen and spent, the variance table, warnings.
compose logs --no-color --tail=40 user | sed 's/^[^|]*| //' | grep -v ' INFO \| DEBUG '
compose stop >/dev/null 2>&1
echo "done: the outputs are in ${DPCA_OUT:-./compose-out} (report.html, components.csv," \
    "eigenvalues.csv, synthetic.csv, study.json); the containers are stopped"
