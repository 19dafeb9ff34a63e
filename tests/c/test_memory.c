/* Memory history (engine/alloc/history.c) without Lua: CPU storages recorded
 * as alloc/free events with sizes, context and call site from a fake
 * provider; nothing while off; the ring's drop counting at max_entries; the
 * live-block table through growth and deletions; tags (including blocks made
 * before recording); categories inferred from phase and override; stop and
 * restart; snapshot files (JSON parsed back, pickle framing). */
#include <stdint.h>
#include <stdlib.h>
#include "test.h"
#include "test_files.h"
#include "internal.h"
#include "io/json_min.h"

static int provider_calls, provider_depth;
static const char *fake_callsite(int depth) {
  provider_calls++;
  provider_depth = depth;
  return em_intern(depth ? "fake.lua:7\nouter.lua:3 in main" : "fake.lua:7");
}

static em_mem_history_opts opts(int64_t max_entries) {
  em_mem_history_opts o = {max_entries, 0, true};
  return o;
}

static em_mem_history copy_history(void) {
  em_mem_history h;
  CHECK(em_mem_history_copy(&h) == 0);
  return h;
}

TEST(nothing_while_off) {
  em_mem_record_history(false, NULL);
  em_mem_clear_history();
  CHECK(!em_mem_history_on());
  em_storage *s = em_storage_new(100, em_cpu());
  em_storage_release(s);
  em_mem_history_stats st;
  em_mem_history_stats_get(&st);
  CHECK(!st.recording && st.entries == 0 && st.recorded == 0);
}

TEST(records_cpu_alloc_and_free) {
  CHECK(em_mem_record_history(true, NULL) == 0);
  CHECK(em_mem_history_on());
  provider_calls = 0;
  em_storage *s;
  {
    EM_OP_SCOPE("fake_op");
    const char *mod = em_ctx_set_module(em_intern("layers.0.attn"));
    em_phase ph = em_ctx_set_phase(EM_PHASE_FORWARD);
    s = em_storage_new(100, em_cpu());
    em_ctx_set_phase(ph);
    em_ctx_set_module(mod);
  }
  void *addr = s->data;
  em_storage_release(s);
  em_mem_history h = copy_history();
  CHECK(h.n_events == 2 && h.n_blocks == 0);
  if (h.n_events == 2) {
    const em_mem_event *a = &h.events[0], *f = &h.events[1];
    CHECK(a->action == EM_MEM_ALLOC && f->action == EM_MEM_FREE);
    CHECK(a->addr == (uint64_t)(uintptr_t)addr && f->addr == a->addr);
    CHECK(a->size == 128 && a->requested == 100 && f->size == 128 && f->requested == 0);
    CHECK(a->device == -1 && a->stream == 0);
    CHECK(a->op && !strcmp(a->op, "fake_op"));
    CHECK(!strcmp(a->module, "layers.0.attn") && a->phase == EM_PHASE_FORWARD);
    CHECK(a->category == EM_MEM_ACTIVATION && f->category == EM_MEM_ACTIVATION);   /* a free says what it freed */
    CHECK(a->callsite && !strcmp(a->callsite, "fake.lua:7"));
    CHECK(a->time_ns > 0 && f->time_ns >= a->time_ns);
  }
  CHECK(provider_calls == 2 && provider_depth == 0);
  em_mem_history_free(&h);
  em_mem_record_history(false, NULL);
}

TEST(categories_from_phase_and_override) {
  em_mem_record_history(true, NULL);
  em_mem_clear_history();
  em_phase phases[] = {EM_PHASE_NONE, EM_PHASE_FORWARD, EM_PHASE_BACKWARD, EM_PHASE_OPTIMIZER};
  em_mem_category want[] = {EM_MEM_OTHER, EM_MEM_ACTIVATION, EM_MEM_AUTOGRAD, EM_MEM_OPTIMIZER_STATE};
  em_storage *keep[5];
  for (int i = 0; i < 4; i++) {
    em_phase prev = em_ctx_set_phase(phases[i]);
    keep[i] = em_storage_new(8, em_cpu());
    em_ctx_set_phase(prev);
  }
  em_mem_category prev = em_mem_set_category_override(EM_MEM_WORKSPACE);
  em_phase ph = em_ctx_set_phase(EM_PHASE_FORWARD);
  keep[4] = em_storage_new(8, em_cpu());
  em_ctx_set_phase(ph);
  CHECK(em_mem_set_category_override(prev) == EM_MEM_WORKSPACE);
  em_mem_history h = copy_history();
  CHECK(h.n_events == 5);
  for (int i = 0; i < 4 && h.n_events == 5; i++) CHECK(h.events[i].category == want[i]);
  if (h.n_events == 5) CHECK(h.events[4].category == EM_MEM_WORKSPACE);
  CHECK(h.n_blocks == 5);
  em_mem_history_free(&h);
  for (int i = 0; i < 5; i++) em_storage_release(keep[i]);
  em_mem_record_history(false, NULL);
}

TEST(drops_oldest_beyond_max_entries) {
  em_mem_history_opts o = opts(10);
  CHECK(em_mem_record_history(true, &o) == 0);
  em_mem_clear_history();
  void *addrs[25];
  for (int i = 0; i < 25; i++) {
    em_storage *s = em_storage_new((size_t)(i + 1) * 64, em_cpu());
    addrs[i] = s->data;
    em_storage_release(s);                     /* 50 events */
  }
  em_mem_history_stats st;
  em_mem_history_stats_get(&st);
  CHECK(st.entries == 10 && st.dropped == 40 && st.recorded == 50 && st.capacity == 10);
  em_mem_history h = copy_history();
  CHECK(h.n_events == 10);
  /* the newest ten: allocs/frees of storages 20..24, oldest first */
  if (h.n_events == 10) {
    CHECK(h.events[0].action == EM_MEM_ALLOC && h.events[0].addr == (uint64_t)(uintptr_t)addrs[20]);
    CHECK(h.events[0].requested == 21 * 64);
    CHECK(h.events[9].action == EM_MEM_FREE && h.events[9].addr == (uint64_t)(uintptr_t)addrs[24]);
  }
  em_mem_history_free(&h);
  /* a smaller limit while recording drops the oldest at once */
  o.max_entries = 4;
  CHECK(em_mem_record_history(true, &o) == 0);
  em_mem_history_stats_get(&st);
  CHECK(st.entries == 4 && st.dropped == 46);
  em_mem_record_history(false, NULL);
}

TEST(live_table_survives_growth_and_deletes) {
  em_mem_record_history(true, NULL);
  em_mem_clear_history();
  enum { N = 5000 };
  em_storage **s = malloc(N * sizeof *s);
  for (int i = 0; i < N; i++) s[i] = em_storage_new(64, em_cpu());
  for (int i = 0; i < N; i += 2) { em_storage_release(s[i]); s[i] = NULL; }
  em_mem_history_stats st;
  em_mem_history_stats_get(&st);
  CHECK(st.live_blocks == N / 2 && st.live_bytes == (N / 2) * 64);
  em_mem_history h = copy_history();
  CHECK(h.n_blocks == N / 2);
  int found = 0;
  for (int i = 1; i < N; i += 2) {
    for (int64_t lo = 0, hi = h.n_blocks - 1; lo <= hi;) {     /* blocks are sorted by address */
      int64_t mid = (lo + hi) / 2;
      uint64_t a = h.blocks[mid].alloc.addr, want = (uint64_t)(uintptr_t)s[i]->data;
      if (a == want) { found++; break; }
      if (a < want) lo = mid + 1; else hi = mid - 1;
    }
  }
  CHECK(found == N / 2);
  for (int64_t i = 1; i < h.n_blocks; i++) CHECK(h.blocks[i - 1].alloc.addr < h.blocks[i].alloc.addr);
  em_mem_history_free(&h);
  for (int i = 0; i < N; i++) em_storage_release(s[i]);
  free(s);
  em_mem_history_stats_get(&st);
  CHECK(st.live_blocks == 0 && st.live_bytes == 0);
  em_mem_record_history(false, NULL);
}

TEST(tags) {
  em_storage *before = em_storage_new(1000, em_cpu());     /* made before recording */
  em_mem_tag(before, EM_MEM_PARAMETER);                     /* off: nothing */
  em_mem_record_history(true, NULL);
  em_mem_clear_history();
  em_storage *s = em_storage_new(256, em_cpu());
  em_mem_tag(s, EM_MEM_GRADIENT);
  em_mem_tag(s, EM_MEM_GRADIENT);                          /* unchanged: no event */
  em_mem_tag(before, EM_MEM_PARAMETER);
  em_mem_history h = copy_history();
  CHECK(h.n_events == 3);
  if (h.n_events == 3) {
    CHECK(h.events[1].action == EM_MEM_TAG && h.events[1].category == EM_MEM_GRADIENT && h.events[1].size == 256);
    CHECK(h.events[2].action == EM_MEM_TAG && h.events[2].category == EM_MEM_PARAMETER && h.events[2].size == 1024);
  }
  CHECK(h.n_blocks == 2);
  for (int64_t i = 0; i < h.n_blocks; i++) {
    const em_mem_block *b = &h.blocks[i];
    if (b->alloc.addr == (uint64_t)(uintptr_t)s->data)
      CHECK(b->has_alloc && b->has_tag && b->category == EM_MEM_GRADIENT && b->alloc.category == EM_MEM_OTHER);
    else
      CHECK(!b->has_alloc && !b->has_tag && b->category == EM_MEM_PARAMETER && b->alloc.size == 1024);
  }
  em_mem_history_free(&h);
  em_storage_release(before);                               /* its free carries its category */
  h = copy_history();
  CHECK(h.n_events == 4 && h.n_blocks == 1);
  if (h.n_events == 4) CHECK(h.events[3].action == EM_MEM_FREE && h.events[3].category == EM_MEM_PARAMETER);
  em_mem_history_free(&h);
  em_storage_release(s);
  em_mem_record_history(false, NULL);
}

TEST(stop_freezes_and_restart_is_fresh) {
  em_mem_record_history(true, NULL);
  em_mem_clear_history();
  em_storage *s = em_storage_new(64, em_cpu());
  em_mem_record_history(false, NULL);
  em_storage_release(s);                                    /* not recorded */
  em_mem_history_stats st;
  em_mem_history_stats_get(&st);
  CHECK(!st.recording && st.stopped && st.entries == 1 && st.live_blocks == 1);
  em_mem_record_history(true, NULL);                        /* a fresh history */
  em_mem_history_stats_get(&st);
  CHECK(st.recording && !st.stopped && st.entries == 0 && st.live_blocks == 0);
  em_mem_history_opts o = {EM_MEM_DEFAULT_MAX_ENTRIES, 0, false};   /* CPU off */
  em_mem_record_history(true, &o);
  em_storage_release(em_storage_new(64, em_cpu()));
  em_mem_history_stats_get(&st);
  CHECK(st.entries == 0 && !st.cpu);
  em_mem_record_history(false, NULL);
  em_mem_clear_history();
  em_mem_history_stats_get(&st);
  CHECK(!st.stopped && st.entries == 0 && st.live_blocks == 0);
}

TEST(bad_options) {
  em_mem_history_opts o = opts(0);
  CHECK_ERR_CONTAINS(em_mem_record_history(true, &o) < 0, "max_entries >= 1");
  o = opts(10);
  o.stack_depth = 33;
  CHECK_ERR_CONTAINS(em_mem_record_history(true, &o) < 0, "stack_depth in [0, 32]");
  CHECK(!em_mem_history_on());
}

TEST(stack_depth_reaches_the_provider) {
  em_mem_history_opts o = opts(100);
  o.stack_depth = 3;
  em_mem_record_history(true, &o);
  em_mem_clear_history();
  em_storage_release(em_storage_new(8, em_cpu()));
  em_mem_history h = copy_history();
  CHECK(provider_depth == 3);
  CHECK(h.n_events == 2 && h.events[0].callsite && strchr(h.events[0].callsite, '\n'));
  em_mem_history_free(&h);
  em_mem_record_history(false, NULL);
}

TEST(snapshot_files) {
  em_mem_history_opts o = opts(100);
  o.stack_depth = 1;
  em_mem_record_history(true, &o);
  em_mem_clear_history();
  em_storage *keep = em_storage_new(300, em_cpu());
  em_storage_release(em_storage_new(40, em_cpu()));
  const char *json = tmp_path("snap.json"), *pkl = tmp_path("snap.pickle");
  CHECK(em_mem_snapshot_save(json, EM_MEM_FORMAT_JSON) == 0);
  CHECK(em_mem_snapshot_save(pkl, EM_MEM_FORMAT_PICKLE) == 0);
  size_t n = 0;
  unsigned char *text = read_bytes(json, &n);
  jm_value root;
  char err[200];
  CHECK(text && jm_parse((const char *)text, n, 0, &root, err, sizeof err) == JM_OK);
  if (text && root.kind == JM_OBJECT) {
    const jm_value *fmt = jm_get(&root, "format"), *trace = jm_get(&root, "trace"),
                   *blocks = jm_get(&root, "blocks"), *strings = jm_get(&root, "strings");
    CHECK(fmt && fmt->kind == JM_STRING && !strcmp(fmt->u.str.s, "ember.memory_snapshot"));
    CHECK(trace && trace->kind == JM_ARRAY && trace->u.arr.n == 3);
    CHECK(blocks && blocks->kind == JM_ARRAY && blocks->u.arr.n == 1);
    CHECK(strings && strings->kind == JM_ARRAY && strings->u.arr.n >= 2);
    if (trace && trace->u.arr.n == 3) {
      const jm_value *row = &trace->u.arr.items[0];
      CHECK(row->kind == JM_ARRAY && row->u.arr.n == 12);
      CHECK(row->u.arr.items[1].kind == JM_STRING && !strcmp(row->u.arr.items[1].u.str.s, "alloc"));
      CHECK(row->u.arr.items[5].is_int && row->u.arr.items[5].u.num.i == 300);
      int64_t site = row->u.arr.items[11].u.num.i;
      CHECK(strings && site > 0 && (size_t)site < strings->u.arr.n &&
            !strcmp(strings->u.arr.items[site].u.str.s, "fake.lua:7\nouter.lua:3 in main"));
    }
    jm_free(&root);
  }
  free(text);
  unsigned char *p = read_bytes(pkl, &n);
  CHECK(p && n > 4 && p[0] == 0x80 && p[1] == 2 && p[n - 1] == '.');
  free(p);
  CHECK_ERR_CONTAINS(em_mem_snapshot_save("/nonexistent-dir/x.json", EM_MEM_FORMAT_JSON) < 0, "memory.snapshot");
  em_storage_release(keep);
  em_mem_record_history(false, NULL);
  em_mem_clear_history();
}

int main(void) {
  if (tmpdir_create("ember_memory_")) return 2;
  em_mem_set_callsite_fn(fake_callsite);
  RUN(nothing_while_off);
  RUN(records_cpu_alloc_and_free);
  RUN(categories_from_phase_and_override);
  RUN(drops_oldest_beyond_max_entries);
  RUN(live_table_survives_growth_and_deletes);
  RUN(tags);
  RUN(stop_freezes_and_restart_is_fresh);
  RUN(bad_options);
  RUN(stack_depth_reaches_the_provider);
  RUN(snapshot_files);
  CHECK(clear_dir() == 0);
  rmdir(tmpdir);
  TEST_MAIN_END();
}
