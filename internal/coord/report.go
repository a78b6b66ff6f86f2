package coord

import (
	"context"
	"net/http"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/model"
)

// Report is a job's overhead model so far, its replication, interval and
// restart odds (coordv1.Report; docs/planning.md).
func (c *Coordinator) Report(ctx context.Context, name string) (*coordv1.Report, error) {
	f, err := c.intervals.reportFacts(ctx, name)
	if err != nil {
		return nil, err
	}
	r := model.Report(f)
	return &r, nil
}

func (c *Coordinator) serveReport(w http.ResponseWriter, r *http.Request, name string) {
	out, err := c.Report(r.Context(), name)
	reply(w, http.StatusOK, out, err)
}

// noteCopy adds a copy made from start to end to a checkpoint's Copied:
// to the last span if it overlaps it or follows within a second, else
// as a span of its own (of at most maxCopySpans, the oldest merged).
func noteCopy(ck *coordv1.Ckpt, start, end time.Time, bytes int64) {
	start, end = start.UTC(), end.UTC()
	if n := len(ck.Copied); n > 0 && !start.After(ck.Copied[n-1].To.Add(time.Second)) {
		s := &ck.Copied[n-1]
		if start.Before(s.From) {
			s.From = start
		}
		if end.After(s.To) {
			s.To = end
		}
		s.Copies++
		s.Bytes += bytes
		return
	}
	ck.Copied = append(ck.Copied, coordv1.CopySpan{From: start, To: end, Copies: 1, Bytes: bytes})
	if len(ck.Copied) > maxCopySpans {
		a, b := ck.Copied[0], ck.Copied[1]
		ck.Copied = append([]coordv1.CopySpan{{From: a.From, To: b.To, Copies: a.Copies + b.Copies, Bytes: a.Bytes + b.Bytes}}, ck.Copied[2:]...)
	}
}

// maxCopySpans keeps a checkpoint record's size bounded.
const maxCopySpans = 8
