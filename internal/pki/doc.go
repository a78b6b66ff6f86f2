// Package pki is the cluster's certificate authority and the credentials
// that let agents, the coordinator and the CLI authenticate each other over
// mutual TLS (docs/security.md, "The control plane").
//
// # Nouns
//
//   - cluster: every node, coordinator and client that trusts one CA. A
//     cluster is made once, by `cairn init` ([Init]).
//   - cluster id: 128 random bits, in hex, chosen by [Init] and written into
//     the CA's subject (O=cairn, CN=cairn cluster <cluster id>). Unlike the
//     ids elsewhere in cairn it is not a content hash: it only tells clusters
//     apart in messages and in [Identity]. Trust comes from the CA key, never
//     from the id.
//   - CA: the cluster's self-signed certificate authority ([CA]): ca.crt and
//     ca.key. It signs leaf certificates only (MaxPathLen 0), so no node
//     can act as a CA in turn. ca.key is the cluster's root secret: it
//     stays on the machine that ran `cairn init` and is needed only to issue
//     credentials.
//   - name: what a user chose to call a node, the coordinator or a client.
//     A name is one lowercase DNS label, [a-z0-9-], 1 to 63 bytes, not
//     beginning or ending with '-' (see [ValidateName]). It is the leaf's
//     CN and its DNS SAN, and, being a single label, it can never be a path
//     ("..", "/") when it names a directory or a file.
//   - role: what a leaf certificate is for ([Role]): [Agent] (a node agent),
//     [Coordinator] or [Client] (the CLI). The role is the leaf's only OU,
//     so the coordinator can authorise a peer by role. Agents and the
//     coordinator both serve and call, so their certificates allow server
//     and client auth; a Client certificate allows client auth only and
//     cannot serve.
//   - credentials: one leaf certificate, its private key and the CA
//     certificate it chains to ([Credentials]), as `cairn node cert NODE`
//     writes them: node.crt, node.key and ca.crt in one directory.
//   - identity: who is at the other end of a verified connection
//     ([Identity]: name, role, cluster id), read by [PeerIdentity].
//
// # Keys
//
// All keys are ECDSA P-256. Ed25519 would do as well in Go, but P-256 is the
// one signature scheme that every TLS 1.3 stack, openssl/curl, hardware
// keystores (TPM, PKCS#11, cloud KMS) and FIPS 140 modules all accept, so an
// operator can inspect, debug or later move the CA key to hardware without
// re-keying the cluster. Private keys are stored as PKCS #8 PEM blocks in
// files of mode 0600; certificates as PEM in files of mode 0644.
//
// # Validity
//
// The CA is valid for 10 years and leaf certificates for 1 year by default.
// Both start 5 minutes in the past to tolerate clock skew between machines,
// and a leaf never outlives its CA: its NotAfter is clamped to the CA's.
//
// # TLS
//
// [ServerConfig] and [ClientConfig] speak TLS 1.3 only, require a
// certificate from both sides (tls.RequireAndVerifyClientCert) and trust the
// cluster CA alone, never the system roots. The client checks the server's
// name against its DNS or IP SANs. Both sides also check, after the standard
// verification, that the peer's certificate is a well-formed cairn leaf of
// the same cluster (ErrUnauthenticated, ErrWrongCluster). Session tickets
// are off: every connection presents and verifies a certificate, so expiry
// and a new CA take effect on the next connection.
//
// There is no revocation list yet: to shut a node out, re-run `cairn init
// --force` and re-issue every other node's credentials.
package pki
