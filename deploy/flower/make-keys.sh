#!/usr/bin/env bash
# Certificates for the SuperLink (TLS) and key pairs for SuperNode authentication.
#   bash deploy/flower/make-keys.sh OUT_DIR SUPERLINK_HOST [NODES]
# SUPERLINK_HOST is the name or IP address SuperNodes and `flwr` dial (it goes in the
# certificate's subjectAltName). NODES (default 3) ECDSA P-384 key pairs in OpenSSH format,
# as Flower 1.41's `--auth-supernode-private-key` and `flwr supernode register` read them.
# Keep ca.key offline; copy ca.crt to every SuperNode and to the submitting machine, and
# each supernode-<i> private key to its own machine only.
set -euo pipefail
out=${1:?OUT_DIR}; host=${2:?SUPERLINK_HOST}; nodes=${3:-3}
mkdir -p "$out"; umask 077
if [[ $host =~ ^[0-9.]+$ || $host == *:* ]]; then san="IP:$host"; else san="DNS:$host"; fi
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:secp384r1 -nodes -days 365 \
  -keyout "$out/ca.key" -out "$out/ca.crt" -subj "/CN=fedshift SuperLink CA" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:secp384r1 -nodes \
  -keyout "$out/server.key" -out "$out/server.csr" -subj "/CN=$host" 2>/dev/null
openssl x509 -req -in "$out/server.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
  -CAcreateserial -days 365 -out "$out/server.pem" \
  -extfile <(printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\n' "$san") 2>/dev/null
rm -f "$out/server.csr" "$out/ca.srl"
for i in $(seq 0 $((nodes - 1))); do
  ssh-keygen -q -t ecdsa -b 384 -N '' -C "supernode-$i" -f "$out/supernode-$i"
done
chmod 644 "$out/ca.crt" "$out"/*.pub
echo "wrote $out: ca.crt ca.key server.pem server.key supernode-{0..$((nodes - 1))}{,.pub}"
