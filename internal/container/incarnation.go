package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cairn-hpc/cairn/internal/image"
)

// A container's processes run once from its start and once more from
// every restore: each run is an incarnation. Its log, container.log,
// reads as the output of one uninterrupted run: a checkpoint keeps the
// log up to the instant it froze the container (keepOutput, output.go),
// and a restore starts the new incarnation's log with it. What the
// incarnation it replaces printed after that checkpoint is kept apart,
// as that incarnation's log:
//
//	<data>/containers/NAME/
//	  container.log        the current incarnation: the output restored
//	                       from its checkpoint, then its own
//	  incarnations.json    the incarnations of the container here, oldest
//	                       first (none: one, the first run)
//	  incarnations/N.log   earlier incarnation N's container.log as it ended
//
// Numbers go on across nodes: a restore is incarnation 1 + the higher of
// the one its checkpoint was taken in (recorded in the image) and the
// last one here.

const (
	logName          = "container.log"
	incarnationsFile = "incarnations.json"
	incarnationsDir  = "incarnations"
)

// Incarnation is one run of a container's processes on this node.
type Incarnation struct {
	N            int       `json:"incarnation"`
	Started      time.Time `json:"started"`
	RestoredFrom string    `json:"restored_from,omitempty"` // the checkpoint (NAME:SEQ), for a restore
	// Restored is the output a restore started with: its checkpoint's.
	Restored int64 `json:"restored_bytes,omitempty"`
	// Exit is how an earlier incarnation ended, if its shim recorded it;
	// Checkpointed, that `checkpoint --stop` ended it.
	Exit         *Exit `json:"exit,omitempty"`
	Checkpointed bool  `json:"checkpointed,omitempty"`
	// Log is its output, relative to the container's dir.
	Log string `json:"log"`

	// Filled in by Incarnations, not stored.
	Current bool  `json:"current,omitempty"`
	Bytes   int64 `json:"bytes,omitempty"` // the log's size
}

// incarnationError is returned for an incarnation a container does not
// have here; it matches ErrNotFound.
type incarnationError struct {
	name string
	n    int
}

func (e *incarnationError) Error() string {
	return fmt.Sprintf("container %s has no incarnation %d on this node (cairn logs %s --incarnations lists them)", e.name, e.n, e.name)
}

func (e *incarnationError) Is(target error) bool { return target == ErrNotFound }

// loadIncarnations reads the container's incarnations; a container
// without the file has one, its first run.
func (m *Manager) loadIncarnations(st *State) ([]Incarnation, error) {
	b, err := os.ReadFile(filepath.Join(m.dir(st.Config.Name), incarnationsFile))
	if errors.Is(err, os.ErrNotExist) {
		started := st.Started
		if started.IsZero() {
			started = st.Created
		}
		return []Incarnation{{N: 1, Started: started, RestoredFrom: st.RestoredFrom, Log: logName}}, nil
	}
	if err != nil {
		return nil, err
	}
	var incs []Incarnation
	if err := json.Unmarshal(b, &incs); err != nil || len(incs) == 0 {
		return nil, fmt.Errorf("read incarnations of %s: %v", st.Config.Name, err)
	}
	return incs, nil
}

// incarnations is loadIncarnations for a checkpoint or a restore, which a
// damaged list must not stop: the container then counts as in the
// incarnation after the last whose log is kept, and those logs stay.
func (m *Manager) incarnations(st *State) []Incarnation {
	incs, err := m.loadIncarnations(st)
	if err == nil {
		return incs
	}
	n := 1
	ents, _ := os.ReadDir(filepath.Join(m.dir(st.Config.Name), incarnationsDir))
	for _, e := range ents {
		if k, err := strconv.Atoi(strings.TrimSuffix(e.Name(), ".log")); err == nil && k >= n {
			n = k + 1
		}
	}
	m.log.Warn("incarnations unreadable; counting on from the logs kept", "rank", st.Config.Name, "incarnation", n, "err", err)
	return []Incarnation{{N: n, Started: st.Started, Log: logName}}
}

// Incarnations lists a container's incarnations on this node, oldest
// first; the last is the current one.
func (m *Manager) Incarnations(name string) ([]Incarnation, error) {
	st, err := m.loadState(name)
	if err != nil {
		return nil, err
	}
	incs, err := m.loadIncarnations(st)
	if err != nil {
		return nil, err
	}
	for i := range incs {
		incs[i].Current = i == len(incs)-1
		if fi, err := os.Stat(filepath.Join(m.dir(name), incs[i].Log)); err == nil {
			incs[i].Bytes = fi.Size()
		}
	}
	return incs, nil
}

// IncarnationLog returns the path of the log of a container's incarnation
// n on this node (0: the current one).
func (m *Manager) IncarnationLog(name string, n int) (string, error) {
	incs, err := m.Incarnations(name)
	if err != nil {
		return "", err
	}
	if n == 0 {
		n = incs[len(incs)-1].N
	}
	for _, inc := range incs {
		if inc.N == n {
			return filepath.Join(m.dir(name), inc.Log), nil
		}
	}
	return "", &incarnationError{name: name, n: n}
}

// beginIncarnation starts the log of a container about to be restored
// from rec with the output kept with rec (the file history; "" for an
// image that kept none) and records the new incarnation. A container
// replaced in place (replaced) keeps its log as its last incarnation's.
// st is the container's state before the restore changes it.
func (m *Manager) beginIncarnation(name string, st *State, rec *image.Record, history string, replaced bool) error {
	dir := m.dir(name)
	var incs []Incarnation
	last := 0
	if replaced {
		incs = m.incarnations(st)
		cur := &incs[len(incs)-1]
		last = cur.N
		cur.Exit, _ = readExit(dir)
		cur.Checkpointed = st.Checkpointed
		cur.Log = filepath.Join(incarnationsDir, strconv.Itoa(cur.N)+".log")
		if err := os.MkdirAll(filepath.Join(dir, incarnationsDir), 0o700); err != nil {
			return err
		}
		for from, to := range map[string]string{logName: cur.Log, image.TimesOf(logName): image.TimesOf(cur.Log)} {
			if err := os.Rename(filepath.Join(dir, from), filepath.Join(dir, to)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("keep the log of incarnation %d: %w", cur.N, err)
			}
		}
	}
	from := 1 // an image from before incarnations: at least the first
	if rec.Log != nil && rec.Log.Incarnation > from {
		from = rec.Log.Incarnation
	}
	restored, err := installLog(filepath.Join(dir, logName), history)
	if err != nil {
		return err
	}
	incs = append(incs, Incarnation{
		N: max(last, from) + 1, Started: time.Now().UTC(), RestoredFrom: rec.Name(),
		Restored: restored, Log: logName,
	})
	return writeJSONAtomic(filepath.Join(dir, incarnationsFile), incs)
}

// installLog makes path a copy of history ("": an empty file), and its
// times history's (none if it has none), and returns its size.
func installLog(path, history string) (int64, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(tmp.Name())
	var n int64
	if history != "" {
		in, err := os.Open(history)
		if err != nil {
			tmp.Close()
			return 0, err
		}
		n, err = io.Copy(tmp, in)
		in.Close()
		if err != nil {
			tmp.Close()
			return 0, fmt.Errorf("restore the log: %w", err)
		}
	}
	if err := tmp.Close(); err != nil {
		return 0, err
	}
	if err := installTimes(path, history, n); err != nil {
		return 0, err
	}
	return n, os.Rename(tmp.Name(), path)
}

// keepOutput copies the container's log up to now into the staged image
// dir as image.LogName and says what the record keeps of it. The
// container is frozen, so the shim's flush makes the cut exact; stopped
// means the dump ended the processes instead, and the log is complete
// once the shim has read the pipe to its end and exited. A shim that
// cannot flush (one from before flushes) costs the output still in the
// pipe, not the checkpoint.
func (m *Manager) keepOutput(ctx context.Context, st *State, imgDir string, stopped bool) (*image.LogInfo, error) {
	name := st.Config.Name
	dir := m.dir(name)
	logPath := filepath.Join(dir, logName)
	cut := int64(-1)
	if stopped {
		m.waitShim(st, flushTimeout)
	} else if n, err := flushOutput(ctx, dir); err == nil {
		cut = n
	} else {
		m.log.Warn("output still in the pipe may be missing from the checkpoint's log", "rank", name, "err", err)
	}
	in, err := os.Open(logPath)
	if errors.Is(err, os.ErrNotExist) {
		in, err = os.Open(os.DevNull)
	}
	if err != nil {
		return nil, err
	}
	defer in.Close()
	if cut < 0 {
		fi, err := in.Stat()
		if err != nil {
			return nil, err
		}
		cut = fi.Size()
	}
	if err := keepMarks(logPath, filepath.Join(imgDir, image.LogTimesName), cut); err != nil {
		return nil, fmt.Errorf("keep the log's times: %w", err)
	}
	out, err := os.OpenFile(filepath.Join(imgDir, image.LogName), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	n, err := io.CopyN(out, in, cut)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, io.EOF) {
		m.log.Warn("the log is shorter than its shim said", "rank", name, "bytes", n, "flushed", cut)
		err = nil
	}
	if err != nil {
		return nil, fmt.Errorf("keep the log: %w", err)
	}
	incs := m.incarnations(st)
	return &image.LogInfo{Incarnation: incs[len(incs)-1].N, Bytes: n}, nil
}

// installTimes gives path the marks of history for its first n bytes,
// the log made from it. history's times came with an image, a peer's or
// an imported one, and are read as any input is: marks that go back give
// the log no times (its lines show none), rather than a file that the
// shim's next marks would follow out of order and that every later
// checkpoint would refuse; marks past the log's end are left out.
func installTimes(path, history string, n int64) error {
	os.Remove(image.TimesOf(path))
	if history == "" {
		return nil
	}
	marks, err := loadMarks(history)
	if errors.Is(err, errBadMarks) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("restore the log's times: %w", err)
	}
	return writeMarks(image.TimesOf(path), marks, n)
}
