#!/usr/bin/env bash
# A nix remote builder reached over OpenSSH: set one up on this machine (as root), or stop it.
#
#   scripts/team-builder.sh up DIR PORT     # sshd on 127.0.0.1:PORT, a builder user, its own nix store
#   scripts/team-builder.sh down DIR        # stop that sshd, revoke DIR's client key
#
# `up` is idempotent (run it again: nothing changes but a stopped sshd is started) and prints, last, the two
# lines a client needs:
#
#   FLAKEBOT_NIX_BUILDERS='ssh-ng://fbbuilder@127.0.0.1?remote-store=local?root=/home/fbbuilder/store x86_64-linux DIR/client_key 1 1 - - HOSTKEY'
#   NIX_SSHOPTS='-p PORT -o HostKeyAlias=127.0.0.1'   (the builders line pins the host key; the alias makes ssh
#                                                      look it up without the port)
#
# What it makes:
#   - openssh-server (apt-get, when /usr/sbin/sshd is missing);
#   - the builder user $FLAKEBOT_BUILDER_USER (default fbbuilder), able to log in with a key only
#     (its password field is `*`: a locked account `!` is refused by sshd even with a key);
#   - the builder's nix store, a chroot store in its home (~/store/nix/store): nothing it builds touches the
#     system's store, and nix's builds run sandboxed in a user namespace as that user;
#   - its ~/.config/nix/nix.conf: the sandbox paths of the host toolchain the stand-in nixpkgs builds with,
#     the rust toolchain hard-linked to /opt/flakebot-builder-rust (root's rustup directory is not readable
#     by the builder); never `sandbox = false`;
#   - in DIR: sshd's host key, config, pid file and log, and a client key the builder user accepts.
# On a real team the builder is another machine: run `up` there (without the sshd part, its own sshd serves),
# copy DIR/client_key to the clients and use the printed FLAKEBOT_NIX_BUILDERS with its host name.
set -euo pipefail

user="${FLAKEBOT_BUILDER_USER:-fbbuilder}"
toolchain_copy=/opt/flakebot-builder-rust

die() { echo "team-builder.sh: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (it adds a user and starts an sshd)"
command="${1:-}"
dir="${2:-}"
[ -n "$command" ] && [ -n "$dir" ] || die "usage: team-builder.sh up DIR PORT | down DIR"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"

sshd_running() {
    [ -r "$dir/sshd.pid" ] && kill -0 "$(cat "$dir/sshd.pid")" 2>/dev/null
}

if [ "$command" = down ]; then
    if sshd_running; then
        kill "$(cat "$dir/sshd.pid")"
        for _ in $(seq 50); do sshd_running || break; sleep 0.1; done
    fi
    rm -f "$dir/sshd.pid"
    home="$(getent passwd "$user" | cut -d: -f6 || true)"
    if [ -n "$home" ] && [ -f "$dir/client_key.pub" ] && [ -f "$home/.ssh/authorized_keys" ]; then
        grep -vxF -f "$dir/client_key.pub" "$home/.ssh/authorized_keys" > "$home/.ssh/authorized_keys.new" || true
        mv "$home/.ssh/authorized_keys.new" "$home/.ssh/authorized_keys"
    fi
    echo "builder in $dir: stopped"
    exit 0
fi

[ "$command" = up ] || die "unknown command $command (up or down)"
port="${3:-}"
[[ "$port" =~ ^[0-9]+$ ]] || die "usage: team-builder.sh up DIR PORT (a free TCP port on 127.0.0.1)"

if [ ! -x /usr/sbin/sshd ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openssh-server \
        || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openssh-server; }
fi
command -v nix >/dev/null || die "nix is not installed: run scripts/setup-nix.sh first"

if ! getent passwd "$user" >/dev/null; then
    useradd -m -s /bin/bash "$user"
fi
usermod -p '*' "$user"
home="$(getent passwd "$user" | cut -d: -f6)"
install -d -o "$user" -g "$user" "$home/store" "$home/.config" "$home/.config/nix"
install -d -m 700 -o "$user" -g "$user" "$home/.ssh"

# the toolchain the stand-in nixpkgs finds at /opt/host-rust in the sandbox (scripts/setup-nix.sh binds it)
source_toolchain="$(sed -n 's|.*/opt/host-rust=\([^ ]*\).*|\1|p' /etc/nix/nix.conf | head -n1)"
if [ -n "$source_toolchain" ] && [ ! -d "$toolchain_copy" ]; then
    cp -al "$source_toolchain" "$toolchain_copy" 2>/dev/null || cp -a "$source_toolchain" "$toolchain_copy"
fi
paths="/bin /lib /lib64? /usr/bin /usr/lib /usr/lib64? /usr/include? /etc/alternatives /usr/share/cargo/registry"
[ -d "$toolchain_copy" ] && paths="$paths /opt/host-rust=$toolchain_copy"
conf="sandbox = true
sandbox-paths = $paths
build-users-group =
experimental-features = nix-command flakes"
if [ "$(cat "$home/.config/nix/nix.conf" 2>/dev/null)" != "$conf" ]; then
    printf '%s\n' "$conf" > "$home/.config/nix/nix.conf"
    chown "$user:" "$home/.config/nix/nix.conf"
fi

[ -f "$dir/host_key" ] || ssh-keygen -q -t ed25519 -N '' -C "flakebot builder host" -f "$dir/host_key"
[ -f "$dir/client_key" ] || ssh-keygen -q -t ed25519 -N '' -C "flakebot builder client" -f "$dir/client_key"
touch "$home/.ssh/authorized_keys"
grep -qxF -f "$dir/client_key.pub" "$home/.ssh/authorized_keys" || cat "$dir/client_key.pub" >> "$home/.ssh/authorized_keys"
chown "$user:" "$home/.ssh/authorized_keys"
chmod 600 "$home/.ssh/authorized_keys"

cat > "$dir/sshd_config" <<EOF
Port $port
ListenAddress 127.0.0.1
HostKey $dir/host_key
PidFile $dir/sshd.pid
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
AllowUsers $user
StrictModes no
EOF
mkdir -p /run/sshd
if ! sshd_running; then
    /usr/sbin/sshd -f "$dir/sshd_config" -E "$dir/sshd.log"
    for _ in $(seq 50); do sshd_running && break; sleep 0.1; done
    sshd_running || die "sshd did not start; see $dir/sshd.log"
fi

system="$(uname -m)-linux"
host_key="$(base64 -w0 < "$dir/host_key.pub")"
echo "FLAKEBOT_NIX_BUILDERS='ssh-ng://$user@127.0.0.1?remote-store=local?root=$home/store $system $dir/client_key 1 1 - - $host_key'"
echo "NIX_SSHOPTS='-p $port -o HostKeyAlias=127.0.0.1'"
