#!/usr/bin/env bash
# Install what pycni needs on a Debian 12 machine, skipping what is already there.
#
#   scripts/install-deps.sh          everything the test suite needs (CI)
#   scripts/install-deps.sh --demo   only what `make demo` needs
#
# apt: only missing packages are installed (one `apt-get update` first, if any are missing).
# pip: the project itself, editable, with its test and nftables extras, unless every requirement
# in pyproject.toml (dependencies, and the extras the mode needs) is installed at an allowed
# version (scripts/python_deps.py: metadata only, no imports). With everything present this is
# one dpkg-query and one python start (~0.2 s): `make test` runs it every time.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export DEBIAN_FRONTEND=noninteractive

DEMO_APT=(iproute2 nftables iputils-ping procps etcd-server)  # etcd: the demo's two-node part
FULL_APT=("${DEMO_APT[@]}" make conntrack containernetworking-plugins golang-go
          golang-github-appc-cni-dev iperf3 openssl netcat-openbsd socat ca-certificates git)
# pyproject.toml's extras each mode needs besides the dependencies; all installed: pip is skipped
DEMO_EXTRAS=(nft)
FULL_EXTRAS=(test nft lint)

mode=full
[[ ${1:-} == --demo ]] && mode=demo

say() { printf '==> %s\n' "$*"; }

missing_apt() {  # one dpkg-query for all: prints the packages not installed
    local -A installed=()
    local pkg status
    while read -r status pkg; do
        [[ $status == installed ]] && installed[$pkg]=1
    done < <(dpkg-query -W -f='${db:Status-Status} ${Package}\n' "$@" 2>/dev/null || true)
    for pkg in "$@"; do
        [[ -n ${installed[$pkg]:-} ]] || printf '%s\n' "$pkg"
    done
}

install_apt() {
    local -a missing
    mapfile -t missing < <(missing_apt "$@")
    if ((${#missing[@]} == 0)); then
        say "Debian packages: all present"
        return
    fi
    if [[ $(id -u) != 0 ]]; then
        echo "missing Debian packages (${missing[*]}): run as root" >&2
        exit 1
    fi
    say "Debian packages: installing ${missing[*]}"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

pip_system_flag() {
    # Debian's own python3 refuses pip installs (PEP 668) unless told
    "$PYTHON" -c 'import os, sysconfig; print("--break-system-packages" if os.path.exists(
        os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else "")'
}

install_pip() {
    local -a extras=("${FULL_EXTRAS[@]}")
    local missing
    [[ $mode == demo ]] && extras=("${DEMO_EXTRAS[@]}")
    if missing=$("$PYTHON" scripts/python_deps.py "${extras[@]}" 2>&1); then
        say "Python packages: all present"
        return
    fi
    say "Python packages missing: ${missing//$'\n'/, }"
    if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then  # Debian's python3 comes without pip
        install_apt python3-pip
    fi
    local spec=".[$(IFS=,; echo "${extras[*]}")]"
    say "Python packages: pip install -e '$spec'"
    # shellcheck disable=SC2046
    "$PYTHON" -m pip install -q --disable-pip-version-check --root-user-action=ignore $(pip_system_flag) -e "$spec"
}

if [[ $mode == demo ]]; then install_apt "${DEMO_APT[@]}"; else install_apt "${FULL_APT[@]}"; fi
install_pip
