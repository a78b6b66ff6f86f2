// Package layering holds only a test: it enforces the import rules of
// docs/architecture.md (which packages may import which), as a linter's
// depguard rules would, with nothing to install.
package layering
