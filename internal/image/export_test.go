package image

// SaveRecord writes a record as a checkpoint's last step does.
func SaveRecord(r Repo, rec *Record) error { return r.saveRecord(rec) }
