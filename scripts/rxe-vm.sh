#!/usr/bin/env bash
# rxe-vm.sh - run commands on real rdma-core verbs (Soft-RoCE, rdma_rxe) inside a small QEMU guest.
#
# For hosts without RDMA hardware (and often without InfiniBand support in their kernel): boots a
# throw-away VM whose kernel has Soft-RoCE and runs a command there, so the InfiniBand-verbs
# channel can be tested against the real libibverbs and rxe provider.
#
# Usage:
#   scripts/rxe-vm.sh setup
#       Install the host packages (apt-get, sudo if not root, never removing packages), fetch
#       Debian's kernel and build the guest's base initramfs, all cached. Idempotent; quick when
#       already done. Runs automatically when needed.
#   scripts/rxe-vm.sh [--timeout SECS] [--smp N] [--mem MB] [--bin PATH]... [--file PATH]... \
#                     -- SHELL-COMMAND
#       Boot a guest, run SHELL-COMMAND with busybox sh in /tmp/work, stream its stdout+stderr to
#       this script's stdout and exit with its status. --bin copies an executable (and the shared
#       libraries ldd lists) to /opt/bin (on the guest's PATH); --file copies a file or directory
#       to /opt/files/<basename>. Defaults: --timeout 600 (host side, whole run) --smp 2 --mem 2048.
#   scripts/rxe-vm.sh [OPTIONS] EXECUTABLE ARGS...
#       Runner form (e.g. CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER=scripts/rxe-vm.sh): same as
#       `--bin EXECUTABLE -- 'basename ARGS...'` with the arguments quoted.
#
# In the guest: rxe0 on dummy0 (10.77.0.1/24) is up with the RoCE v2 GID ::ffff:10.77.0.1 at index
# 1; lo is up; /dev (devtmpfs), /proc, /sys, /dev/shm, /tmp are mounted; ptrace_scope is 0;
# `ulimit -l unlimited`; HOME=/root; POLYRAIL_IB_DEVICE=rxe0:1 and POLYRAIL_IB_GID_INDEX=1 are
# exported, then every POLYRAIL_* and RUST_* variable of the host (these override). Available:
# busybox applets, the host's ip and rdma, ibv_devinfo, ibv_*_pingpong, perftest (ib_write_lat,
# ib_write_bw, ib_read_bw, ib_send_lat, ...), rping if installed. Client and server share the one
# rxe device (two rxe devices in one guest cannot reach each other), e.g.
#   scripts/rxe-vm.sh -- 'ib_write_lat -d rxe0 -x 1 -s 8 & sleep 1; ib_write_lat -d rxe0 -x 1 -s 8 10.77.0.1'
# Under TCG, numbers only show that things work; for latencies pin the two sides to different
# vCPUs (taskset -c 0 ... & taskset -c 1 ...), else they may share one and wait for 4 ms ticks.
#
# Exit status: the command's; 124 when the timeout expired; 125 when the guest did not get to
# run the command (boot or rxe set-up failure); 2 for usage errors. On 124/125 the tail of the
# guest's console log is printed to stderr (the whole log of the last run is kept in the cache).
#
# How it works: Debian's linux-image-6.1 package is fetched with `apt-get download` and unpacked
# with `dpkg -x` (never installed). The uncompressed vmlinux is extracted from the bzImage, QEMU
# boots it directly through its PVH entry (much faster than the bzImage under TCG). The guest is
# an initramfs made of two concatenated cpio archives: a cached base (static busybox, /init, the
# rxe modules, the host's ip/rdma/verbs tools and perftest with their libraries) and a small
# per-run archive (the --bin/--file payload, the command and its environment). Serial ports:
# ttyS0 = kernel console (a log file), ttyS1 = the command's output (this script's stdout),
# ttyS2 = the command's exit status. /init powers the guest off when the command is done (and
# kills what the command left running). The output port is slow (~250 KB/s under TCG).
# TCG is used when /dev/kvm is unusable (absent, the kvm_pvm module, no vmx/svm), KVM otherwise.
# QEMU and busybox-static are installed unless apt would have to remove a host package for them
# (e.g. a newer qemu-utils from backports); then they are unpacked into the cache instead.
#
# Environment: RXE_VM_CACHE (cache dir, default <repo>/target/rxe-vm), RXE_VM_ACCEL (kvm|tcg,
# forces the choice), RXE_VM_KERNEL_PKG (kernel package, default: what linux-image-amd64 depends
# on), RXE_VM_VERBOSE=1 (progress and timings on stderr).
set -euo pipefail

SELF=$(readlink -f "${BASH_SOURCE[0]}")
REPO=$(cd "$(dirname "$SELF")/.." && pwd)
CACHE=${RXE_VM_CACHE:-$REPO/target/rxe-vm}

# Host packages (besides QEMU and busybox-static, see install_or_unpack): cpio and xz for building
# the guest image, the rest is copied into the guest.
HOST_PACKAGES=(rdma-core ibverbs-utils ibverbs-providers libibverbs1 librdmacm1
    perftest iproute2 cpio xz-utils)
MULTIARCH=x86_64-linux-gnu
# Host programs copied into the guest (missing optional ones are skipped).
GUEST_TOOLS=(ip rdma ibv_devinfo ibv_devices ibv_rc_pingpong ibv_ud_pingpong ibv_srq_pingpong
    ibv_uc_pingpong ib_write_lat ib_write_bw ib_read_lat ib_read_bw ib_send_lat ib_send_bw
    ib_atomic_lat ib_atomic_bw rping ucmatose udaddy)
REQUIRED_TOOLS=(ip rdma ibv_devinfo ibv_rc_pingpong ib_write_lat ib_write_bw ib_read_bw ib_send_lat)
# Kernel modules, in load order (their dependencies are added in front automatically).
# crc32_generic must come before rdma_rxe (rxe computes its ICRC with the crypto API's crc32).
GUEST_MODULES=(crc32_generic dummy udp_tunnel ip6_udp_tunnel ib_core ib_uverbs rdma_rxe configfs
    ib_cm iw_cm rdma_cm rdma_ucm)
GUEST_IP=10.77.0.1

VERBOSE=${RXE_VM_VERBOSE:-}
VM_PID=
RUN_DIR=
QEMU=()

die() { echo "rxe-vm: $*" >&2; exit 2; }
log() { echo "rxe-vm: $*" >&2; }
vlog() { if [[ -n $VERBOSE ]]; then log "$@"; fi; }

# Quote a string for a POSIX shell: 'it'\''s'.
shquote() { printf "'%s'" "${1//\'/\'\\\'\'}"; }

# Run a command as root (sudo only when not root already).
as_root() { if [[ $EUID -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

# apt-get with a few retries (the dpkg lock may be busy, a mirror may hiccup).
apt_get() {
    local attempt
    for attempt in 1 2 3 4; do
        if as_root env DEBIAN_FRONTEND=noninteractive apt-get -y -q \
            -o DPkg::Lock::Timeout=120 "$@"; then
            return 0
        fi
        log "apt-get $1 failed (attempt $attempt), retrying"
        sleep $((attempt * 5))
        as_root env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=120 \
            update >/dev/null 2>&1 || true
    done
    return 1
}

# Is package $1 installed?
installed() { [[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null) == installed ]]; }

# Install the host packages that are missing (never removing any).
install_packages() {
    local pkg missing=()
    for pkg in "${HOST_PACKAGES[@]}"; do
        installed "$pkg" || missing+=("$pkg")
    done
    if ((${#missing[@]})); then
        log "installing ${missing[*]}"
        apt_get install --no-install-recommends --no-remove "${missing[@]}" >&2
    fi
}

# Packages that can conflict with what a host already has: qemu-system-x86 (this kind of
# machine has a newer qemu-utils from bookworm-backports, which breaks bookworm's
# qemu-system-common 7.2) and busybox-static (conflicts with the dynamic busybox). Each is
# installed when apt can do that without removing anything; otherwise the packages apt would
# install are unpacked with dpkg -x under $CACHE/unpacked/PKG/root and used from there.
install_or_unpack() {
    local pkg=$1 dir=$CACHE/unpacked/$1
    if installed "$pkg" || [[ -d $dir/root ]]; then
        return 0
    fi
    local plan removals
    if ! plan=$(LC_ALL=C apt-get install -s --no-install-recommends "$pkg" 2>&1); then
        apt_get update >&2
        plan=$(LC_ALL=C apt-get install -s --no-install-recommends "$pkg" 2>&1) ||
            die "cannot install $pkg: $plan"
    fi
    removals=$(awk '/^Remv / { printf "%s ", $2 }' <<<"$plan")
    if [[ -z $removals ]]; then
        log "installing $pkg"
        apt_get install --no-install-recommends --no-remove "$pkg" >&2
        return 0
    fi
    log "installing $pkg would remove ${removals% }; unpacking it under $dir instead"
    local tmp=$dir.tmp deb
    local -a pkgs
    mapfile -t pkgs < <(awk '/^Inst / { print $2 }' <<<"$plan")
    ((${#pkgs[@]})) || die "apt-get plans to install nothing for $pkg:"$'\n'"$plan"
    rm -rf "$tmp"
    mkdir -p "$tmp/deb"
    chmod 0777 "$tmp/deb" # apt-get download hands the files to the _apt user
    if ! (cd "$tmp/deb" && apt-get download "${pkgs[@]}") >"$tmp/download.log" 2>&1; then
        cat "$tmp/download.log" >&2
        die "apt-get download ${pkgs[*]} failed"
    fi
    for deb in "$tmp"/deb/*.deb; do
        dpkg -x "$deb" "$tmp/root"
    done
    rm -rf "$tmp/deb" "$dir"
    mv "$tmp" "$dir"
}

# QEMU: any installed qemu-system-x86_64, else the package (installed or unpacked).
ensure_qemu() {
    if ! command -v qemu-system-x86_64 >/dev/null; then
        install_or_unpack qemu-system-x86
        set_qemu_command
        "${QEMU[@]}" -version >/dev/null || die "QEMU (${QEMU[*]}) does not run"
    fi
}

# Print the path of a static busybox (busybox-static, installed or unpacked).
find_busybox() {
    local path
    for path in $(find_tool busybox) "$CACHE"/unpacked/busybox-static/root/{usr/bin,bin}/busybox; do
        if [[ -x $path && $(LC_ALL=C ldd "$path" 2>&1) == *"not a dynamic"* ]]; then
            echo "$path"
            return 0
        fi
    done
    return 1
}

# Set QEMU to the command that runs QEMU (installed or the private copy).
set_qemu_command() {
    if command -v qemu-system-x86_64 >/dev/null; then
        QEMU=(qemu-system-x86_64)
    else
        local root=$CACHE/unpacked/qemu-system-x86/root
        QEMU=(env "LD_LIBRARY_PATH=$root/usr/lib/$MULTIARCH:$root/lib/$MULTIARCH"
            "QEMU_MODULE_DIR=$root/usr/lib/$MULTIARCH/qemu"
            "$root/usr/bin/qemu-system-x86_64"
            -L "$root/usr/share/qemu" -L "$root/usr/share/seabios")
    fi
}

# Fingerprint of what the cached guest image depends on: this script, the packages, the kernel.
fingerprint() {
    {
        sha256sum <"$SELF"
        dpkg-query -W -f='${Package} ${Version} ${db:Status-Status}\n' "${HOST_PACKAGES[@]}" \
            busybox-static 2>&1
        cat "$CACHE/kernel/package"
        echo "${RXE_VM_KERNEL_PKG:-}"
    } | sha256sum | cut -d' ' -f1
}

# The kernel package to use: RXE_VM_KERNEL_PKG, else what linux-image-amd64 depends on.
kernel_package() {
    if [[ -n ${RXE_VM_KERNEL_PKG:-} ]]; then
        echo "$RXE_VM_KERNEL_PKG"
        return
    fi
    local pkg
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
        awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')
    if [[ -z $pkg ]]; then
        apt_get update >&2
        pkg=$(apt-cache depends linux-image-amd64 |
            awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')
    fi
    [[ -n $pkg ]] || die "cannot find the kernel package (linux-image-amd64's dependency)"
    echo "$pkg"
}

# Extract the uncompressed vmlinux (ELF, with a PVH entry) from a bzImage: the header gives the
# payload's offset and length, its first bytes the compression.
extract_vmlinux() {
    local img=$1 out=$2 sects offset length start magic
    sects=$(od -An -tu1 -j $((0x1f1)) -N1 "$img" | tr -d ' ')
    ((sects)) || sects=4
    offset=$(od -An -tu4 -j $((0x248)) -N4 "$img" | tr -d ' ')
    length=$(od -An -tu4 -j $((0x24c)) -N4 "$img" | tr -d ' ')
    start=$(((sects + 1) * 512 + offset))
    magic=$(od -An -tx1 -j "$start" -N4 "$img" | tr -d ' \n')
    local -a unpack
    case $magic in
    fd377a58) unpack=(xz -dc --single-stream) ;;
    1f8b*) unpack=(gzip -dc) ;;
    28b52ffd) unpack=(zstd -dcq) ;;
    5d00*) unpack=(xz -dc --format=lzma) ;;
    425a68*) unpack=(bzip2 -dc) ;;
    *) return 1 ;;
    esac
    # Decompressors may complain about the size word the kernel build appends; check the result.
    tail -c +$((start + 1)) "$img" | head -c "$length" | "${unpack[@]}" >"$out" 2>/dev/null || true
    [[ $(od -An -tx1 -N4 "$out" | tr -d ' \n') == 7f454c46 ]]
}

# Fetch and unpack the kernel into $CACHE/kernel: vmlinux (or bzImage), the guest's modules in
# load order (modules/*.ko + modules/order). Kept until the kernel package changes.
fetch_kernel() {
    local pkg kdir=$CACHE/kernel
    pkg=$(kernel_package)
    if [[ -f $kdir/package && $(<"$kdir/package") == "$pkg" ]]; then
        return 0
    fi
    log "fetching kernel $pkg"
    rm -rf "$kdir" "$CACHE/kernel.tmp"
    local tmp=$CACHE/kernel.tmp
    mkdir -p "$tmp/deb" "$tmp/new/modules"
    chmod 0777 "$tmp/deb" # apt-get download hands the file to the _apt user
    if ! (cd "$tmp/deb" && apt-get download "$pkg" >download.log 2>&1); then
        apt_get update >&2
        (cd "$tmp/deb" && apt-get download "$pkg") >&2 || die "apt-get download $pkg failed"
    fi
    dpkg -x "$tmp"/deb/*.deb "$tmp/x"
    local img kver
    img=$(find "$tmp/x/boot" -name 'vmlinuz-*' | head -n1)
    [[ -n $img ]] || die "no vmlinuz in $pkg"
    kver=${img##*/vmlinuz-}
    if extract_vmlinux "$img" "$tmp/new/vmlinux"; then
        echo vmlinux >"$tmp/new/image"
    else
        log "could not extract vmlinux from the bzImage; booting the (slower) bzImage"
        rm -f "$tmp/new/vmlinux"
        cp "$img" "$tmp/new/bzImage"
        echo bzImage >"$tmp/new/image"
    fi
    echo "$kver" >"$tmp/new/version"
    collect_modules "$tmp/x/lib/modules/$kver" "$tmp/new/modules"
    echo "$pkg" >"$tmp/new/package"
    mv "$tmp/new" "$kdir"
    rm -rf "$tmp"
}

# Copy GUEST_MODULES and their dependencies (from each module's .modinfo) from the unpacked
# module tree $1 to $2 (uncompressed, flat), writing the load order to $2/order.
collect_modules() {
    local tree=$1 dest=$2 f name
    local -A path=() seen=()
    local -a order=()
    while IFS= read -r f; do
        name=${f##*/}
        name=${name%%.ko*}
        path[${name//-/_}]=$f
    done < <(find "$tree" -name '*.ko*')
    visit() {
        local m=$1 dep deps
        [[ -z ${seen[$m]:-} ]] || return 0
        seen[$m]=1
        if [[ -z ${path[$m]:-} ]]; then
            grep -q "/${m}.ko" "$tree/modules.builtin" 2>/dev/null ||
                grep -q "/${m//_/-}.ko" "$tree/modules.builtin" 2>/dev/null ||
                die "kernel module $m not found"
            return 0 # built in
        fi
        case ${path[$m]} in
        *.ko.xz) xz -dc "${path[$m]}" >"$dest/$m.ko" ;;
        *.ko.zst) zstd -dcq "${path[$m]}" >"$dest/$m.ko" ;;
        *.ko.gz) gzip -dc "${path[$m]}" >"$dest/$m.ko" ;;
        *) cp "${path[$m]}" "$dest/$m.ko" ;;
        esac
        deps=$(tr '\0' '\n' <"$dest/$m.ko" | sed -n 's/^depends=//p' | head -n1)
        for dep in ${deps//,/ }; do
            visit "${dep//-/_}"
        done
        order+=("$m")
    }
    local m
    for m in "${GUEST_MODULES[@]}"; do
        visit "$m"
    done
    printf '%s\n' "${order[@]}" >"$dest/order"
}

# Copy an executable or library to the guest tree $1 at its host path (directories resolved, so
# /lib/... lands in usr/lib/... next to the usrmerge links), unless already in the base image.
install_file() {
    local root=$1 src=$2 dest
    dest=$(readlink -f "$(dirname "$src")")/${src##*/}
    [[ -e $root$dest || -e $CACHE/base/root$dest ]] && return 0
    mkdir -p "$root$(dirname "$dest")"
    cp -L "$src" "$root$dest"
}

# Print the absolute paths of the shared libraries (and loader) that ldd lists for $1.
libraries_of() {
    local out
    if ! out=$(LC_ALL=C ldd "$1" 2>&1); then
        [[ $out == *"not a dynamic executable"* || $out == *"statically linked"* ]] && return 0
        die "ldd $1 failed: $out"
    fi
    if grep -q 'not found' <<<"$out"; then
        die "libraries of $1 not found:"$'\n'"$(grep 'not found' <<<"$out")"
    fi
    awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }' <<<"$out"
}

# Copy a host program with its libraries to the guest tree $1; the program goes to $3 (a guest
# path) or to its host path.
install_program() {
    local root=$1 prog=$2 dest=${3:-} lib libs
    libs=$(libraries_of "$prog")
    if [[ -n $dest ]]; then
        mkdir -p "$root$(dirname "$dest")"
        cp -L "$prog" "$root$dest"
    else
        install_file "$root" "$prog"
    fi
    while IFS= read -r lib; do
        [[ -z $lib ]] || install_file "$root" "$lib"
    done <<<"$libs"
}

# Print a shell function that runs program $2 at guest path $3 if busybox (in tree $1) has an
# applet of that name (the guest's busybox sh would run the applet instead).
applet_overrides() {
    if grep -qx -- "$2" "$1/etc/rxe-vm/applets.txt"; then
        printf '%s() { %s "$@"; }\n' "$2" "$(shquote "$3")"
    fi
}

# Find a host program by name in the usual directories.
find_tool() {
    local dir
    for dir in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin; do
        if [[ -x $dir/$1 && -f $dir/$1 ]]; then
            echo "$dir/$1"
            return 0
        fi
    done
    return 1
}

# The guest's /init (busybox sh, PID 1): mount, load modules, bring up rxe0, run the command
# from the per-run archive with its output on ttyS1 and its status on ttyS2, power off.
# Failures before the command print to the console (ttyS0) and power off without a status.
write_init() {
    cat <<'EOF'
#!/bin/sh
export PATH=/opt/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
say() { echo "rxe-vm init: $*" >/dev/console; }
fail() { say "FAILED: $*"; poweroff -f; sleep 10; exit 1; }

mount -t devtmpfs devtmpfs /dev || fail "mount /dev"
mkdir -p /dev/shm /dev/pts /dev/mqueue
mount -t proc proc /proc && mount -t sysfs sysfs /sys || fail "mount /proc, /sys"
mount -t tmpfs -o mode=1777,nosuid,nodev shm /dev/shm || fail "mount /dev/shm"
mount -t tmpfs -o mode=1777 tmp /tmp && mount -t tmpfs -o mode=0755 run /run || fail "mount /tmp"
mount -t devpts devpts /dev/pts
mount -t mqueue mqueue /dev/mqueue 2>/dev/null
hostname rxe-vm

. /etc/rxe-vm/prelude.sh
for m in $(cat /etc/rxe-vm/modules); do
    insmod "/lib/modules/rxe-vm/$m.ko" || fail "insmod $m"
done
mount -t configfs configfs /sys/kernel/config 2>/dev/null

ip link set lo up || fail "lo up"
# (loading the dummy module usually creates dummy0 already)
[ -e /sys/class/net/dummy0 ] || ip link add dummy0 type dummy || fail "add dummy0"
ip addr add @GUEST_IP@/24 dev dummy0 && ip link set dummy0 up || fail "dummy0 up"
rdma link add rxe0 type rxe netdev dummy0 || fail "rdma link add rxe0"
gids=/sys/class/infiniband/rxe0/ports/1
i=0
until [ "$(cat $gids/gids/1 2>/dev/null)" = "0000:0000:0000:0000:0000:ffff:@GUEST_GID@" ] &&
    [ "$(cat $gids/gid_attrs/types/1 2>/dev/null)" = "RoCE v2" ]; do
    i=$((i + 1))
    [ $i -le 300 ] || fail "rxe0 GID index 1 (::ffff:@GUEST_IP@, RoCE v2) did not appear"
    sleep 0.1
done
[ -e /proc/sys/kernel/yama/ptrace_scope ] && echo 0 >/proc/sys/kernel/yama/ptrace_scope
ulimit -l unlimited || fail "ulimit -l unlimited"
[ -f /etc/rxe-vm/cmd.sh ] || fail "no command"

# ttyS1: raw (no \n -> \r\n), held open by init so the final stty drains it; ttyS2 likewise.
exec 3<>/dev/ttyS1 4<>/dev/ttyS2
stty raw -echo <&3 && stty raw -echo <&4 || fail "stty"
mkdir -p /tmp/work /root
cd /tmp/work
export HOME=/root USER=root LOGNAME=root SHELL=/bin/sh TERM=dumb
export POLYRAIL_IB_DEVICE=rxe0:1 POLYRAIL_IB_GID_INDEX=1
[ -f /etc/rxe-vm/env.sh ] && . /etc/rxe-vm/env.sh
say "running the command"
sh /etc/rxe-vm/cmd.sh </dev/null >&3 2>&3 3>&- 4>&-
rc=$?
say "command exited with status $rc"
kill -KILL -1 2>/dev/null
stty raw -echo <&3
echo "$rc" >&4
stty raw -echo <&4
poweroff -f
EOF
}

# Build the base guest tree ($CACHE/base/root) and its archive ($CACHE/base.cpio).
build_base() {
    local tmp=$CACHE/base.tmp root kdir=$CACHE/kernel
    rm -rf "$tmp" "$CACHE/base" "$CACHE/base.cpio"
    root=$tmp/root
    mkdir -p "$root"/{dev,proc,sys,tmp,run,root,etc/rxe-vm,opt/bin,opt/files,usr/bin,usr/sbin}
    # Mirror the host's usrmerge links so paths from ldd and PT_INTERP work unchanged.
    local d
    for d in bin sbin lib lib32 lib64 libx32; do
        if [[ -L /$d ]]; then
            ln -s "$(readlink "/$d")" "$root/$d"
            mkdir -p "$root/$(readlink -f "/$d")"
        elif [[ -d /$d ]]; then
            mkdir -p "$root/$d"
        fi
    done
    # busybox and its applets (host programs copied later replace applets of the same name).
    # Debian's static busybox prefers its applets to programs on PATH; applets.txt lets the
    # per-run command define shell functions for programs that must win (see applet_overrides).
    local busybox applet
    busybox=$(find_busybox) || die "no static busybox (package busybox-static)"
    cp "$busybox" "$root/usr/bin/busybox"
    for applet in $("$busybox" --list); do
        [[ $applet == busybox || -e $root/usr/bin/$applet ]] ||
            ln -s busybox "$root/usr/bin/$applet"
    done
    "$busybox" --list >"$root/etc/rxe-vm/applets.txt"
    # Host tools with their libraries.
    local tool path
    : >"$root/etc/rxe-vm/prelude.sh"
    for tool in "${GUEST_TOOLS[@]}"; do
        if path=$(find_tool "$tool"); then
            rm -f "$root/usr/bin/$tool" "$root/usr/sbin/$tool"
            install_program "$root" "$path"
            applet_overrides "$root" "$tool" "$(readlink -f "$(dirname "$path")")/$tool" \
                >>"$root/etc/rxe-vm/prelude.sh"
        elif [[ " ${REQUIRED_TOOLS[*]} " == *" $tool "* ]]; then
            die "required host program $tool not found"
        fi
    done
    # The rxe verbs provider: the driver file and the library it names.
    local driver provider
    driver=/etc/libibverbs.d/rxe.driver
    [[ -f $driver ]] || die "$driver not found (package ibverbs-providers)"
    provider=$(find /usr/lib /usr/lib64 -path '*/libibverbs/librxe-rdmav*.so' 2>/dev/null |
        head -n1)
    [[ -n $provider ]] || die "librxe-rdmav*.so not found (package ibverbs-providers)"
    install_file "$root" "$driver"
    install_program "$root" "$provider"
    # Modules, /etc, /init.
    mkdir -p "$root/lib/modules/rxe-vm"
    cp "$kdir"/modules/*.ko "$root/lib/modules/rxe-vm/"
    cp "$kdir/modules/order" "$root/etc/rxe-vm/modules"
    echo 'root:x:0:0:root:/root:/bin/sh' >"$root/etc/passwd"
    echo 'root:x:0:' >"$root/etc/group"
    printf '127.0.0.1 localhost\n%s rxe-vm\n::1 localhost\n' "$GUEST_IP" >"$root/etc/hosts"
    echo rxe-vm >"$root/etc/hostname"
    local gid
    gid=$(printf '%02x%02x:%02x%02x' ${GUEST_IP//./ })
    write_init | sed -e "s/@GUEST_IP@/$GUEST_IP/g" -e "s/@GUEST_GID@/$gid/g" >"$root/init"
    chmod 0755 "$root/init"
    make_cpio "$root" "$tmp/base.cpio"
    mkdir -p "$CACHE/base"
    mv "$tmp/root" "$CACHE/base/root"
    mv "$tmp/base.cpio" "$CACHE/base.cpio"
    rm -rf "$tmp"
}

# Archive directory $1 as an uncompressed newc cpio (owned by root) into $2.
make_cpio() {
    (cd "$1" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) >"$2"
}

# Is the cache complete and current (QEMU there, kernel and base image built for these packages)?
setup_done() {
    [[ -f $CACHE/stamp && -f $CACHE/base.cpio && -f $CACHE/kernel/package ]] &&
        { command -v qemu-system-x86_64 >/dev/null ||
            [[ -x $CACHE/unpacked/qemu-system-x86/root/usr/bin/qemu-system-x86_64 ]]; } &&
        [[ $(<"$CACHE/stamp") == "$(fingerprint)" ]]
}

# Make sure packages, QEMU, kernel and base image are there and current (under a lock, so
# concurrent runs wait for one set-up; quick when all is done).
setup() {
    mkdir -p "$CACHE"
    if setup_done; then
        return 0
    fi
    local lock
    exec {lock}>"$CACHE/.lock"
    flock "$lock"
    if ! setup_done; then
        install_packages
        install_or_unpack busybox-static
        ensure_qemu
        fetch_kernel
        log "building the guest image"
        build_base
        fingerprint >"$CACHE/stamp"
    fi
    exec {lock}>&-
}

# TCG unless /dev/kvm is usable: present and writable, not the kvm_pvm nested hypervisor, and a
# CPU with vmx/svm.
pick_accel() {
    if [[ -n ${RXE_VM_ACCEL:-} ]]; then
        echo "$RXE_VM_ACCEL"
    elif [[ -w /dev/kvm && ! -d /sys/module/kvm_pvm ]] &&
        ! grep -qs '^kvm_pvm ' /proc/modules && grep -qwE 'vmx|svm' /proc/cpuinfo; then
        echo kvm
    else
        echo tcg
    fi
}

# Kill the VM (if running) and remove the run directory.
cleanup() {
    if [[ -n $VM_PID ]]; then
        kill -TERM "$VM_PID" 2>/dev/null || true
        wait "$VM_PID" 2>/dev/null || true
        VM_PID=
    fi
    if [[ -n $RUN_DIR ]]; then
        rm -rf "$RUN_DIR"
    fi
}

# Print the tail of the guest console log to stderr.
show_console() {
    log "$1; guest console (last 40 lines, whole log in $CACHE/last-console.log):"
    tail -n 40 "$RUN_DIR/console.log" | tr -d '\r' |
        sed -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' -e 's/\x1bc//g' -e 's/^/  | /' >&2
}

# Boot the guest with the per-run payload, run the command and exit with its status. Args:
# timeout smp mem command (BINS and FILES are global arrays).
run_vm() {
    local timeout=$1 smp=$2 mem=$3 command=$4
    trap cleanup EXIT
    trap 'cleanup; exit 130' INT
    trap 'cleanup; exit 143' TERM
    trap 'cleanup; exit 129' HUP
    RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/rxe-vm.XXXXXX")
    local stage=$RUN_DIR/stage item libdirs=() libs lib dir
    mkdir -p "$stage/opt/bin" "$stage/opt/files" "$stage/etc/rxe-vm"
    for item in "${BINS[@]}"; do
        install_program "$stage" "$item" "/opt/bin/${item##*/}"
        # Libraries outside the system directories (found via rpath or LD_LIBRARY_PATH).
        libs=$(libraries_of "$item")
        while IFS= read -r lib; do
            [[ -n $lib ]] || continue
            dir=$(readlink -f "$(dirname "$lib")")
            case $dir in
            /usr/lib | /usr/lib/* | /usr/lib64 | /usr/lib64/* | /lib | /lib/* | /lib64 | /lib64/*) ;;
            *) [[ " ${libdirs[*]} " == *" $dir "* ]] || libdirs+=("$dir") ;;
            esac
        done <<<"$libs"
    done
    for item in "${FILES[@]}"; do
        cp -RL "$item" "$stage/opt/files/"
    done
    {
        echo '. /etc/rxe-vm/prelude.sh'
        for item in "${BINS[@]}"; do
            applet_overrides "$CACHE/base/root" "${item##*/}" "/opt/bin/${item##*/}"
        done
        printf '%s\n' "$command"
    } >"$stage/etc/rxe-vm/cmd.sh"
    {
        local name
        if ((${#libdirs[@]})); then
            local IFS=:
            echo "export LD_LIBRARY_PATH=$(shquote "${libdirs[*]}")"
        fi
        while IFS= read -r name; do
            if [[ $name =~ ^(POLYRAIL|RUST)_[A-Za-z0-9_]*$ ]]; then
                echo "export $name=$(shquote "${!name}")"
            fi
        done < <(compgen -e)
    } >"$stage/etc/rxe-vm/env.sh"
    make_cpio "$stage" "$RUN_DIR/run.cpio"
    cat "$CACHE/base.cpio" "$RUN_DIR/run.cpio" >"$RUN_DIR/initrd"

    local accel kdir=$CACHE/kernel image
    accel=$(pick_accel)
    image=$kdir/$(<"$kdir/image")
    set_qemu_command
    local -a qemu=("${QEMU[@]}" -nodefaults -nographic -no-reboot -monitor none -net none
        -cpu max -smp "$smp" -m "$mem"
        -kernel "$image" -initrd "$RUN_DIR/initrd"
        -append "console=ttyS0 quiet panic=-1 oops=panic rdinit=/init mitigations=off"
        -serial "file:$RUN_DIR/console.log"
        -chardev "stdio,id=out,signal=off" -serial chardev:out
        -serial "file:$RUN_DIR/status")
    if [[ $accel == kvm ]]; then
        qemu+=(-accel kvm)
    else
        qemu+=(-accel "tcg,thread=multi")
    fi
    vlog "booting ($accel, smp $smp, $mem MB, timeout ${timeout}s)"
    local start=$SECONDS rc=0
    timeout --foreground -k 10 "$timeout" "${qemu[@]}" </dev/null &
    VM_PID=$!
    wait "$VM_PID" || rc=$?
    VM_PID=
    vlog "guest finished after $((SECONDS - start)) s"
    cp "$RUN_DIR/console.log" "$CACHE/last-console.log" 2>/dev/null || true
    local status
    status=$(tr -dc '0-9' <"$RUN_DIR/status" 2>/dev/null || true)
    if [[ -n $status ]]; then
        exit "$status"
    fi
    if ((rc == 124)); then
        show_console "timed out after ${timeout}s"
        exit 124
    fi
    show_console "the guest stopped before the command finished (qemu status $rc)"
    exit 125
}

usage() {
    sed -n '2,/^set -euo/p' "$SELF" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'
    exit "${1:-0}"
}

main() {
    local timeout=600 smp=2 mem=2048 command='' have_command=''
    BINS=()
    FILES=()
    if [[ ${1:-} == setup ]]; then
        (($# == 1)) || die "setup takes no arguments"
        setup
        return 0
    fi
    while (($#)); do
        case $1 in
        --timeout | --smp | --mem | --bin | --file)
            (($# >= 2)) || die "$1 needs a value"
            case $1 in
            --timeout) timeout=$2 ;;
            --smp) smp=$2 ;;
            --mem) mem=$2 ;;
            --bin) BINS+=("$2") ;;
            --file) FILES+=("$2") ;;
            esac
            shift 2
            ;;
        --timeout=* | --smp=* | --mem=* | --bin=* | --file=*)
            local opt=${1%%=*} val=${1#*=}
            shift
            set -- "$opt" "$val" "$@"
            ;;
        -h | --help) usage 0 ;;
        --)
            shift
            (($#)) || die "no command after --"
            command="$*"
            have_command=1
            break
            ;;
        -*) die "unknown option $1 (see --help)" ;;
        *)
            # Runner form: EXECUTABLE ARGS...
            [[ -f $1 && -x $1 ]] || die "$1 is not an executable file (commands go after --)"
            BINS+=("$1")
            command=$(shquote "${1##*/}")
            shift
            local arg
            for arg in "$@"; do
                command+=" $(shquote "$arg")"
            done
            have_command=1
            break
            ;;
        esac
    done
    [[ -n $have_command ]] || usage 2 >&2
    [[ $timeout =~ ^[0-9]+$ && $timeout -gt 0 ]] || die "bad --timeout $timeout"
    [[ $smp =~ ^[0-9]+$ && $smp -gt 0 ]] || die "bad --smp $smp"
    [[ $mem =~ ^[0-9]+$ && $mem -ge 256 ]] || die "bad --mem $mem (MB, at least 256)"
    local item
    for item in "${BINS[@]}"; do
        [[ -f $item && -x $item ]] || die "--bin $item is not an executable file"
    done
    for item in "${FILES[@]}"; do
        [[ -e $item ]] || die "--file $item does not exist"
    done
    setup
    run_vm "$timeout" "$smp" "$mem" "$command"
}

main "$@"
