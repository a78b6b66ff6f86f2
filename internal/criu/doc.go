// Package criu finds and checks the CRIU binary cairn drives, and turns
// CRIU's logs into errors a user can act on.
//
// cairn needs CRIU 4.2 or newer on the kernels it runs on: 3.17 fails
// `criu check` on kernels that split the vvar mapping (6.13+), and 4.1
// cannot dump inet sockets on kernels that refuse SO_PASSCRED on them
// (6.16+). [Find] looks for the binary, [Check] runs `criu --version` and
// `criu check` and refuses anything older than [MinVersion].
//
// CRIU itself is run by runc (runc checkpoint/restore) with cairn's CRIU put
// first on runc's PATH and passed with runc's --criu flag, which older runc
// versions honour and newer ones ignore.
package criu
