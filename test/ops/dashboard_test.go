package ops

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestDashboard: the dashboard of a local cluster, in a real headless
// Chromium. Its page is a login form until the browser logs in with the
// cluster's token; then it shows the ring job the test started and every
// node, and while the page stays open (never reloaded) its timeline gains
// the checkpoint the test takes, protected once its copies are made, and
// the migration the test makes, and the rank's new node, from the event
// stream.
func TestDashboard(t *testing.T) {
	c := testutil.NewCluster(t, 3)
	f := c.File()
	if f.UI == "" || !strings.HasPrefix(f.UI, "http://127.0.0.1:") {
		t.Fatalf("the cluster's dashboard is %q, want one on 127.0.0.1", f.UI)
	}
	token, err := os.ReadFile(f.UITokenFile())
	if err != nil {
		t.Fatal(err)
	}
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "2", "--per-node", "1"}, c.RingArgs(50_000_000)...)...)
	place := c.Status("ring").Placement
	free := c.Unused(place)
	c.WaitProgress("ring", 2, 0, 60*time.Second)

	b := testutil.NewBrowser(t)
	defer func() {
		if dir := os.Getenv("CAIRN_TEST_LOGS"); dir != "" && os.MkdirAll(dir, 0o755) == nil {
			b.Screenshot(filepath.Join(dir, "dashboard.png"))
		}
	}()
	// waitDOM polls the page until script returns true.
	waitDOM := func(what, script string, args ...any) {
		t.Helper()
		testutil.WaitUntil(t, 60*time.Second, func() (bool, string) {
			var ok bool
			b.Eval(&ok, script, args...)
			var page string
			b.Eval(&page, "return document.body ? document.body.innerText : ''")
			return ok, fmt.Sprintf("the page never showed %s; it shows:\n%s", what, page)
		})
	}

	b.Navigate(f.UI)
	var login bool
	b.Eval(&login, "return !!document.querySelector('form input[name=token]') && !document.querySelector('#jobs')")
	if !login {
		t.Fatal("the dashboard showed more than its login form to a browser that had not logged in")
	}
	b.Navigate(f.UI + "login?token=" + strings.TrimSpace(string(token)))
	if u := b.URL(); u != f.UI {
		t.Fatalf("after logging in the browser is at %s, want %s", u, f.UI)
	}

	waitDOM("every node alive", `return arguments[0].every(n => {
		const tr = document.querySelector('#nodes tr[data-node="' + n + '"]');
		return tr && tr.querySelector('.badge.alive');
	})`, c.Nodes)
	waitDOM("the ring job", `return !!document.querySelector('#jobs tr[data-job="ring"]')`)
	// Clicked from within the page: the table is drawn again at every
	// event, and an element found by the driver may be gone by its click.
	b.Eval(nil, `document.querySelector('#jobs tr[data-job="ring"] a').click()`)
	waitDOM("the ring's ranks on their nodes", `
		if (document.querySelector('#job-name').textContent !== 'ring') return false;
		const rows = [...document.querySelectorAll('#ranks tbody tr')];
		return rows.length === 2 && rows.every((tr, r) => tr.children[1].textContent === arguments[0][r]);`, place)
	waitDOM("the live event stream", `return document.querySelector('#live').classList.contains('on')`)
	// From here on the page must not load again.
	b.Eval(nil, "window.cairnTestMark = 'same page'")
	var before int
	b.Eval(&before, `return document.querySelectorAll('#timeline [data-kind=checkpoint], #timeline [data-kind=migration]').length`)
	if before != 0 {
		t.Fatalf("the timeline shows %d checkpoints and migrations before any", before)
	}

	c.OK("checkpoint", "ring")
	cks := c.Ckpts("ring")
	if len(cks) != 1 {
		t.Fatalf("checkpoints: %+v", cks)
	}
	seq := cks[0].Seq
	waitDOM(fmt.Sprintf("checkpoint %d", seq), `return !!document.querySelector('#timeline li[data-kind=checkpoint][data-seq="' + arguments[0] + '"]')`, seq)
	waitDOM(fmt.Sprintf("checkpoint %d protected", seq), `
		const li = document.querySelector('#timeline li[data-kind=checkpoint][data-seq="' + arguments[0] + '"]');
		return li.dataset.state === 'protected' && li.textContent.includes('stall') &&
			!!document.querySelector('#chart [data-kind=checkpoint]');`, seq)

	m := c.Migrate("ring/1", "--to", free)
	if m.State != "done" {
		t.Fatalf("migration: %+v", m)
	}
	waitDOM(fmt.Sprintf("migration %d of rank 1 to %s", m.Seq, free), `
		const li = document.querySelector('#timeline li[data-kind=migration][data-seq="' + arguments[0] + '"]');
		return !!li && li.dataset.state === 'done' && li.textContent.includes(arguments[1]) &&
			!!document.querySelector('#chart [data-kind=migration]') &&
			document.querySelector('#ranks tbody tr[data-rank="1"]').children[1].textContent === arguments[1];`, m.Seq, free)

	// A job whose rank fails: its badge turns failed, with the reason,
	// and its node no longer counts it.
	c.OK("run", "--job", "bad", "--ranks", "1", "--nodes", free, "--", "sh", "-c", "sleep 1; exit 7")
	waitDOM("the bad job failed", `
		const td = document.querySelector('#jobs tr[data-job="bad"] td:nth-child(2)');
		return !!td && !!td.querySelector('.badge.failed') && td.title === 'rank 0 exited 7' &&
			!document.querySelector('#nodes tr[data-node="' + arguments[0] + '"]').textContent.includes('bad');`, free)

	var mark string
	b.Eval(&mark, "return window.cairnTestMark || ''")
	if mark != "same page" {
		t.Fatal("the page was loaded again: the timeline must grow without a reload")
	}
	if u := b.URL(); u != f.UI+"#job=ring" {
		t.Errorf("the page is at %s", u)
	}
}
