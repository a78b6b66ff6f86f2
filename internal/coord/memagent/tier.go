package memagent

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
)

// The durable tier, modelled: one bucket per URL shared by every node (as
// an object store is), holding flushed images by name, each with its
// record, and the records of global checkpoints. As the real agents do,
// a fetch takes only a record that names the image it fetches, and a
// damaged image (DamageTier) is refused as corrupt; a tier that is down
// (TierDown) is unreachable.
type memTier struct {
	mu      sync.Mutex
	down    bool
	images  map[imageKey]tierImage
	records map[int][]byte
}

type tierImage struct {
	record  []byte
	damaged bool
}

// tierRecord is the record a modelled flush hands back.
type tierRecord struct {
	Container string `json:"container"`
	Seq       int    `json:"seq"`
	Manifest  string `json:"manifest"`
}

func (c *Cluster) tier(url string) *memTier {
	c.tiersMu.Lock()
	defer c.tiersMu.Unlock()
	if c.tiers == nil {
		c.tiers = map[string]*memTier{}
	}
	t := c.tiers[url]
	if t == nil {
		t = &memTier{images: map[imageKey]tierImage{}, records: map[int][]byte{}}
		c.tiers[url] = t
	}
	return t
}

// TierDown makes the tier at url unreachable (or reachable again).
func (c *Cluster) TierDown(url string, down bool) {
	t := c.tier(url)
	t.mu.Lock()
	t.down = down
	t.mu.Unlock()
}

// DamageTier damages image container:seq in the tier at url: a fetch of
// it is refused as corrupt.
func (c *Cluster) DamageTier(url, container string, seq int) {
	t := c.tier(url)
	t.mu.Lock()
	defer t.mu.Unlock()
	if im, ok := t.images[imageKey{container, seq}]; ok {
		im.damaged = true
		t.images[imageKey{container, seq}] = im
	}
}

// TierImages lists the images in the tier at url, as container:seq.
func (c *Cluster) TierImages(url string) []string {
	t := c.tier(url)
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for k := range t.images {
		out = append(out, k.name+":"+strconv.Itoa(k.seq))
	}
	slices.Sort(out)
	return out
}

// TierRecords lists the numbers of the checkpoint records in the tier at
// url.
func (c *Cluster) TierRecords(url string) []int {
	t := c.tier(url)
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []int
	for seq := range t.records {
		out = append(out, seq)
	}
	slices.Sort(out)
	return out
}

// useTier runs fn on the tier at url unless it is down.
func (c *Cluster) useTier(url string, fn func(t *memTier) error) error {
	t := c.tier(url)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.down {
		return apiErr(agentv1.CodeTierUnreachable, "durable tier unreachable: %s", url)
	}
	return fn(t)
}

// TierFlush "uploads" images of the node into the tier.
func (cl *Client) TierFlush(ctx context.Context, req agentv1.TierFlush) (agentv1.TierFlushed, error) {
	var out agentv1.TierFlushed
	err := cl.call(ctx, "tier-flush", req.URL, func(n *Node) error {
		for _, ref := range req.Images {
			key := imageKey{ref.Container, ref.Seq}
			if !n.images[key] {
				return notFound(fmt.Sprintf("%s:%d", ref.Container, ref.Seq))
			}
		}
		return cl.c.useTier(req.URL, func(t *memTier) error {
			for _, ref := range req.Images {
				key := imageKey{ref.Container, ref.Seq}
				manifest := fmt.Sprintf("m-%s-%d", ref.Container, ref.Seq)
				rec, _ := json.Marshal(tierRecord{Container: ref.Container, Seq: ref.Seq, Manifest: manifest})
				img := agentv1.TierImage{ImageRef: ref, Manifest: manifest, Record: rec, Chunks: 256}
				if _, ok := t.images[key]; !ok {
					img.NewChunks, img.Bytes = 256, 1<<20
				}
				t.images[key] = tierImage{record: rec}
				out.Images = append(out.Images, img)
			}
			return nil
		})
	})
	return out, err
}

// TierFetch brings an image from the tier into the node.
func (cl *Client) TierFetch(ctx context.Context, req agentv1.TierFetch) (agentv1.Image, error) {
	var out agentv1.Image
	err := cl.call(ctx, "tier-fetch", req.Container+":"+strconv.Itoa(req.Seq), func(n *Node) error {
		key := imageKey{req.Container, req.Seq}
		out.Checkpoint = checkpoint(key)
		if n.images[key] {
			return nil
		}
		if err := cl.c.tierHas(agentv1.TierSource{URL: req.URL, Record: req.Record}, key); err != nil {
			return err
		}
		n.images[key] = true
		out.Fetched, out.Bytes = true, 1<<20
		return nil
	})
	return out, err
}

// tierHas checks that the tier holds image key undamaged, and that its
// record names it.
func (c *Cluster) tierHas(src agentv1.TierSource, key imageKey) error {
	var rec tierRecord
	if err := json.Unmarshal(src.Record, &rec); err != nil || rec.Container != key.name || rec.Seq != key.seq {
		return apiErr(agentv1.CodeCorrupt, "checkpoint %s:%d corrupt: record: names another image", key.name, key.seq)
	}
	return c.useTier(src.URL, func(t *memTier) error {
		im, ok := t.images[key]
		switch {
		case !ok:
			return apiErr(agentv1.CodeNotFound, "no such object: image %s:%d in %s", key.name, key.seq, src.URL)
		case im.damaged:
			return apiErr(agentv1.CodeCorrupt, "checkpoint %s:%d corrupt: chunk: damaged object in the durable tier", key.name, key.seq)
		}
		return nil
	})
}

// TierRecord writes a checkpoint record into the tier.
func (cl *Client) TierRecord(ctx context.Context, req agentv1.TierRecord) error {
	return cl.call(ctx, "tier-record", req.URL+" ckpt="+strconv.Itoa(req.Seq), func(n *Node) error {
		return cl.c.useTier(req.URL, func(t *memTier) error {
			t.records[req.Seq] = slices.Clone(req.Data)
			return nil
		})
	})
}

// TierRead reads a checkpoint record from the tier, the newest if Seq is 0.
func (cl *Client) TierRead(ctx context.Context, req agentv1.TierRead) (agentv1.TierRecord, error) {
	out := agentv1.TierRecord{Seq: req.Seq}
	err := cl.call(ctx, "tier-read", req.URL, func(n *Node) error {
		return cl.c.useTier(req.URL, func(t *memTier) error {
			if out.Seq == 0 {
				for seq := range t.records {
					out.Seq = max(out.Seq, seq)
				}
			}
			data, ok := t.records[out.Seq]
			if !ok {
				return apiErr(agentv1.CodeNotFound, "no checkpoint %d in %s", req.Seq, req.URL)
			}
			out.Data = slices.Clone(data)
			return nil
		})
	})
	return out, err
}

// TierPrune deletes the records and images no longer kept.
func (cl *Client) TierPrune(ctx context.Context, req agentv1.TierPrune) (agentv1.TierPruned, error) {
	var out agentv1.TierPruned
	err := cl.call(ctx, "tier-prune", req.URL, func(n *Node) error {
		return cl.c.useTier(req.URL, func(t *memTier) error {
			for seq := range t.records {
				if !slices.Contains(req.Records, seq) {
					delete(t.records, seq)
					out.Records++
				}
			}
			for k := range t.images {
				if !slices.Contains(req.Manifests, fmt.Sprintf("m-%s-%d", k.name, k.seq)) {
					delete(t.images, k)
					out.Manifests++
				}
			}
			return nil
		})
	})
	return out, err
}
