# Sourced by the deploy scripts: `compose` runs docker-compose, or the compose
# plugin where that is what the machine has.
if command -v docker-compose >/dev/null 2>&1; then
    compose() { docker-compose "$@"; }
else
    compose() { docker compose "$@"; }
fi
