package coord

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/catalog"
	"github.com/cairn-hpc/cairn/internal/events"
)

// A backup is a tar of three files: BackupInfo (backup.json), the
// catalog's keys, one JSON object a line ({"key": K, "value": V}), and
// the kept event history, one event a line as events.jsonl holds it.
const (
	backupInfoName    = "backup.json"
	backupCatalogName = "catalog.jsonl"
	backupEventsName  = "events.jsonl"
)

// backupEntry is one line of catalog.jsonl.
type backupEntry struct {
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value"`
}

// Backup returns a backup of the cluster's catalog and event history,
// and what it holds: every key at one revision but those that live only
// as long as a lease (live members, the leader), which the processes
// that run make again.
func (c *Coordinator) Backup(ctx context.Context) (coordv1.BackupInfo, []byte, error) {
	var cat bytes.Buffer
	info := coordv1.BackupInfo{Cluster: c.clusterID(), Time: time.Now().UTC()}
	enc := json.NewEncoder(&cat)
	rev, err := c.cat.Backup(ctx, func(key string, raw []byte) error {
		info.Keys++
		return enc.Encode(backupEntry{Key: key, Value: raw})
	})
	if err != nil {
		return info, nil, fmt.Errorf("backup: %w", err)
	}
	info.Revision = rev
	var ev bytes.Buffer
	if c.opts.Events != nil {
		enc := json.NewEncoder(&ev)
		for _, e := range c.opts.Events.History(events.Filter{}) {
			if err := enc.Encode(e); err != nil {
				return info, nil, err
			}
			info.Events++
		}
	}
	head, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return info, nil, err
	}
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for _, f := range []struct {
		name string
		data []byte
	}{{backupInfoName, append(head, '\n')}, {backupCatalogName, cat.Bytes()}, {backupEventsName, ev.Bytes()}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o600, Size: int64(len(f.data)), ModTime: info.Time, Typeflag: tar.TypeReg}); err != nil {
			return info, nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return info, nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return info, nil, err
	}
	return info, out.Bytes(), nil
}

// clusterID is the cluster this coordinator's credentials are of ("" for
// one without, in tests).
func (c *Coordinator) clusterID() string {
	if c.creds == nil {
		return ""
	}
	return c.creds.ClusterID
}

// ErrBadBackup is wrapped by RestoreCatalog's errors for a file that is
// not a whole backup.
var ErrBadBackup = errors.New("not a cairn backup")

// maxBackupFile bounds each file of a backup read back.
const maxBackupFile = 1 << 30

// RestoreCatalog reads a backup Backup wrote from r, writes its keys into
// cat, which must be empty, and returns the backup's info and its event
// history (for the restored coordinator's events.jsonl). The coordinators'
// term is not restored: the first coordinator on the restored catalog
// starts a new one, of a catalog agents have not seen, so that they take
// its calls whatever term they last saw. The whole backup is read and
// checked before anything is written.
func RestoreCatalog(ctx context.Context, cat *catalog.Catalog, r io.Reader) (coordv1.BackupInfo, []byte, error) {
	var info coordv1.BackupInfo
	files := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return info, nil, fmt.Errorf("%w: %w", ErrBadBackup, err)
		}
		if h.Typeflag != tar.TypeReg || h.Size > maxBackupFile {
			return info, nil, fmt.Errorf("%w: entry %q (type %c, %d bytes)", ErrBadBackup, h.Name, h.Typeflag, h.Size)
		}
		if _, dup := files[h.Name]; dup {
			return info, nil, fmt.Errorf("%w: %s twice", ErrBadBackup, h.Name)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return info, nil, fmt.Errorf("%w: %s: %w", ErrBadBackup, h.Name, err)
		}
		files[h.Name] = b
	}
	for _, name := range []string{backupInfoName, backupCatalogName, backupEventsName} {
		if _, ok := files[name]; !ok {
			return info, nil, fmt.Errorf("%w: no %s", ErrBadBackup, name)
		}
	}
	if err := json.Unmarshal(files[backupInfoName], &info); err != nil {
		return info, nil, fmt.Errorf("%w: %s: %w", ErrBadBackup, backupInfoName, err)
	}
	var entries []backupEntry
	sc := bufio.NewScanner(bytes.NewReader(files[backupCatalogName]))
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var e backupEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Key == "" || !json.Valid(e.Value) {
			return info, nil, fmt.Errorf("%w: %s line %d: %v", ErrBadBackup, backupCatalogName, len(entries)+1, err)
		}
		entries = append(entries, e)
	}
	if err := sc.Err(); err != nil {
		return info, nil, fmt.Errorf("%w: %s: %w", ErrBadBackup, backupCatalogName, err)
	}
	if len(entries) != info.Keys {
		return info, nil, fmt.Errorf("%w: %s holds %d keys, %s says %d", ErrBadBackup, backupCatalogName, len(entries), backupInfoName, info.Keys)
	}
	empty := true
	if _, err := cat.List(ctx, "", func(string, []byte) error { empty = false; return nil }); err != nil {
		return info, nil, err
	}
	if !empty {
		return info, nil, errors.New("restore: the catalog is not empty: restore into a new one")
	}
	for _, e := range entries {
		if e.Key == termKey {
			continue
		}
		if err := cat.Put(ctx, e.Key, e.Value); err != nil {
			return info, nil, fmt.Errorf("restore %s: %w", e.Key, err)
		}
	}
	return info, files[backupEventsName], nil
}
