// Package lazy serves a checkpoint's memory pages to CRIU's lazy-pages
// daemon, so that a restored process runs before all of its memory has
// arrived.
//
// In a lazy restore, `criu restore --lazy-pages` registers the restored
// processes' private anonymous memory with userfaultfd and hands it to a
// `criu lazy-pages` daemon, which fills each page when the process first
// touches it and, once the restore is over, all the others in the
// background. The daemon asks a page server over TCP for the pages; this
// package is that server. It answers from the image's pagemap files
// (which say where each range of a process's memory lies in its pages
// file) and a Source for the pages files' bytes, which package container
// backs with the image's chunks (a lazy Restore), fetched by the node's
// agent from whichever holder still serves them.
//
// The wire protocol is CRIU's page-server protocol (criu/page-xfer.c):
// the daemon sends 32-byte requests {cmd u32, pad u32, nr_pages u64,
// vaddr u64, dst_id u64} (24 bytes without the pad before CRIU 4.2) with
// cmd PS_IOV_GET, dst_id the process's pid in the image and vaddr an
// address at dump time; the server answers in request order with the
// header echoed (cmd PS_IOV_ADD_F|PE_PRESENT<<16, nr_pages at most as
// asked, never 0) and the pages. PS_IOV_CLOSE ends the session with a
// 4-byte status. See docs/lazy.md.
package lazy
