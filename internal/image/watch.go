package image

// WatchQuarantine notes the store's quarantine now, and returns what tells
// the damage found since: a *QuarantineError naming every pack quarantined
// after this call (QuarantinedSince), or nil. When the quarantine cannot
// be read now, damage is always nil.
func (r Repo) WatchQuarantine() (damage func() error) {
	before, err := r.Quarantined()
	if err != nil {
		return func() error { return nil }
	}
	return func() error { return r.QuarantinedSince(before) }
}
