package image

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cairn-hpc/cairn/internal/names"
)

// Stray is an entry of the catalog dir that is neither a container's
// directory of records nor a record: debris of an interrupted write, or
// something put there by hand. No record is ever read from it.
type Stray struct {
	Path   string `json:"path"` // relative to the catalog dir, slash-separated
	Reason string `json:"reason"`
}

// Strays lists the stray entries of the catalog: at its top, anything but
// a directory named like a container; in a container's directory, anything
// but records (SEQ.json) and records being written (temporary files that
// CleanTemp removes); and a container directory without any record. The
// error is for failing to read the catalog itself.
func (r Repo) Strays() ([]Stray, error) {
	top, err := os.ReadDir(r.Dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Stray
	for _, e := range top {
		switch {
		case !e.IsDir():
			out = append(out, Stray{e.Name(), "not a container's directory"})
			continue
		case names.Container(e.Name()) != nil:
			out = append(out, Stray{e.Name(), "not a container name"})
			continue
		}
		ents, err := os.ReadDir(filepath.Join(r.Dir, e.Name()))
		if err != nil {
			out = append(out, Stray{e.Name(), err.Error()})
			continue
		}
		records := 0
		for _, f := range ents {
			p := e.Name() + "/" + f.Name()
			switch {
			case isTempRecord(f.Name()):
			case !f.Type().IsRegular():
				out = append(out, Stray{p, "not a record"})
			case !isRecordName(f.Name()):
				out = append(out, Stray{p, "not a record name (SEQ.json)"})
			default:
				records++
			}
		}
		if records == 0 {
			out = append(out, Stray{e.Name(), "holds no record"})
		}
	}
	return out, nil
}

// isRecordName reports whether name is a record's file name: SEQ.json
// with SEQ written as Itoa writes it.
func isRecordName(name string) bool {
	seq, ok := seqOf(name)
	return ok && name == strconv.Itoa(seq)+".json"
}

// isTempRecord reports whether name is a record being written (or left
// half-written by a crash), which CleanTemp removes.
func isTempRecord(name string) bool {
	return strings.HasSuffix(name, ".tmp") || strings.Contains(name, ".tmp-")
}
