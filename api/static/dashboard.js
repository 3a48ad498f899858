// Strata dashboard: plain JS, no build step. Data comes from the v1 API with the pasted token as a Bearer
// header; every server string is put in the page with textContent (never innerHTML).
"use strict";
(function () {
  const KEY = "strata.token";
  const POLL_MS = 1500;
  const ACTIVE = ["queued", "running"];
  const BATCH_OPEN = ["open", "scheduled", "running"];
  const $ = (id) => document.getElementById(id);

  // Everything that belongs to one sign-in. Signing out or in replaces the object, so a loop or an answer that
  // still holds the old one knows it is stale and stops instead of drawing the previous user's data.
  function fresh() {
    return { me: null, jobs: new Map(), cursor: null, older: null, paged: 0, view: 0, loading: null,
             previews: new Map(), batches: new Map(), timer: null, retry: 0 };
  }
  let state = fresh();

  // Thrown for an answer that arrived after its sign-in ended (or a request made while signed out): not an error
  // to show, and never a reason to sign out again.
  class Stale extends Error {}

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  // Writes only on change: rewriting a cell or an aria-live line each poll re-announces it to screen readers.
  function setText(node, text) { text = String(text); if (node.textContent !== text) node.textContent = text; }
  function setTitle(node, text) { if (node.title !== text) node.title = text; }
  // A <progress> without a value attribute is "indeterminate" (an animation), so 0 must be set too.
  function setProgress(bar, value, label) {
    if (!bar.hasAttribute("value") || bar.value !== value) bar.value = value;
    if (bar.getAttribute("aria-label") !== label) bar.setAttribute("aria-label", label);
  }

  async function api(path, opts) {
    const s = state, token = sessionStorage.getItem(KEY);
    if (!token) throw new Stale("signed out");
    const headers = Object.assign({ Authorization: "Bearer " + token }, (opts && opts.headers) || {});
    let r;
    try { r = await fetch(path, Object.assign({}, opts || {}, { headers })); }
    catch (e) { if (s !== state) throw new Stale("signed out"); throw e; }
    if (s !== state) throw new Stale("signed out");
    if (r.status === 401) { signOut("That token was not accepted (wrong, revoked or expired). Paste a valid token."); throw new Stale("401"); }
    return r;
  }

  async function failure(r) {
    let detail = r.statusText || "HTTP " + r.status;
    try { detail = (await r.json()).detail || detail; } catch (e) { /* not JSON */ }
    const err = new Error(detail); err.status = r.status; return err;
  }

  async function json(path, opts) {
    const s = state;
    const r = await api(path, opts);
    if (!r.ok) throw await failure(r);
    const data = await r.json();
    if (s !== state) throw new Stale("signed out");
    return data;
  }

  function showBanner(msg) { const b = $("banner"); setText(b, msg || ""); b.hidden = !msg; }

  function resetState() {
    clearTimeout(state.timer);
    for (const p of state.previews.values()) if (p.url) URL.revokeObjectURL(p.url);
    state = fresh();
  }

  // The previous user's rows, panels and filters go with the sign-in.
  function clearPage() {
    for (const sel of ["#jobs tbody", "#workers tbody", "#queues tbody", "#batches"]) {
      const n = document.querySelector(sel); if (n) n.replaceChildren();
    }
    for (const id of ["jobs-status", "jobs-updated", "workers-error", "queues-error"]) if ($(id)) setText($(id), "");
    if ($("filters")) { $("filters").reset(); $("older").hidden = true; $("batches-empty").textContent = "No batches."; $("batches-empty").hidden = false; }
    if ($("job-name")) {
      for (const id of ["job-name", "job-summary", "job-progress", "job-error", "render-info"]) setText($(id), "");
      for (const id of ["downloads", "frames", "timeline"]) $(id).replaceChildren();
      delete $("downloads").dataset.key;
      $("job-error").hidden = true; $("job-preview").hidden = true; $("job-preview").removeAttribute("src");
      setText($("preview-caption"), "No preview yet.");
    }
    showBanner("");
  }

  function signOut(message) {
    sessionStorage.removeItem(KEY);
    resetState(); clearPage();
    $("app").hidden = true; $("signout").hidden = true; $("who").textContent = "";
    $("signin").hidden = false;
    $("signin-error").textContent = message || "";
    $("token").focus();
  }

  async function start() {
    resetState(); clearPage();
    const s = state;
    try {
      s.me = await json("/v1/me");
    } catch (e) { if (!(e instanceof Stale)) signOut("Could not reach the service: " + e.message); return; }
    $("signin").hidden = true; $("app").hidden = false; $("signout").hidden = false; $("signin-error").textContent = "";
    $("who").textContent = "Signed in as " + s.me.name + " (" + s.me.role + ")";
    if (document.body.dataset.page === "job") { jobLoop(s); return; }
    $("f-station-wrap").hidden = s.me.role !== "admin";
    jobsLoop(s);
  }

  function fmtDuration(s) {
    if (s === null || s === undefined || !isFinite(s)) return "–";
    s = Math.max(0, Math.round(s));
    const m = Math.floor(s / 60), r = s % 60;
    return m ? m + "m " + String(r).padStart(2, "0") + "s" : r + "s";
  }
  function elapsed(job) {
    if (!job.started_at) return null;
    const end = job.finished_at ? Date.parse(job.finished_at) : Date.now();
    return (end - Date.parse(job.started_at)) / 1000;
  }
  function eta(job) {
    if (job.status !== "running" || job.progress < 0.05) return null;
    const e = elapsed(job); return e === null ? null : e * (1 - job.progress) / job.progress;
  }
  // the workers (node names) its shards ran on: a shard's ``gpu`` alone repeats across workers ("cpu", compose "0")
  function gpus(job) { return [...new Set(job.shards.map((s) => s.worker || s.gpu).filter(Boolean))].join(", ") || "–"; }
  function frameName(f) { return f.original_name || f.name; }
  function shotName(job) { return job.frames.length ? frameName(job.frames[0]) + (job.frames.length > 1 ? " (+" + (job.frames.length - 1) + ")" : "") : job.id; }
  function pct(x) { return Math.round(x * 100) + "%"; }
  // Why a job has no preview, outputs or shards when it will never get them.
  function ended(job) { return job.status === "failed" ? "the job failed" : job.status === "cancelled" ? "the job was cancelled" : null; }

  async function loadPreview(job, img, caption) {
    if (!job.preview_url) return;
    const s = state, tag = job.preview_kind + ":" + job.updated_at;
    const known = s.previews.get(job.id);
    if (known && known.tag === tag) { if (known.url && img.src !== known.url) { img.src = known.url; img.hidden = false; } return; }
    s.previews.set(job.id, { tag, url: known && known.url });  // one fetch per version, however many polls ask
    let blob = null;
    try {
      const r = await api(job.preview_url, { cache: "no-cache" });  // revalidate (ETag): the preview is replaced
      if (r.ok) blob = await r.blob();
    } finally {
      if (!blob) s.previews.set(job.id, known || { tag: null, url: null });  // the next poll tries again
    }
    if (!blob) return;
    if (s !== state) return;
    const url = URL.createObjectURL(blob);
    if (known && known.url) URL.revokeObjectURL(known.url);
    s.previews.set(job.id, { tag, url });
    img.src = url; img.hidden = false;
    img.dataset.kind = job.preview_kind;
    if (caption) caption.textContent = job.preview_kind === "final" ? "Preview of the final render." : "Quick preview (before the render).";
  }

  // One child per item, by key: a kept node is updated in place and moved only when the order changed, so a link
  // or button in it keeps keyboard focus across polls.
  function syncChildren(parent, items, keyOf, make, update) {
    const keys = new Set(items.map(keyOf));
    for (const n of [...parent.children]) if (!keys.has(n.dataset.key)) n.remove();
    const have = new Map([...parent.children].map((n) => [n.dataset.key, n]));
    let ref = parent.firstElementChild;
    for (const item of items) {
      let n = have.get(keyOf(item));
      if (!n) { n = make(item); n.dataset.key = keyOf(item); }
      update(n, item);
      if (n === ref) ref = n.nextElementSibling; else parent.insertBefore(n, ref);
    }
  }

  // ---- jobs list -------------------------------------------------------------------------------------------
  const rowParts = new WeakMap();

  function batchLabel(id) {
    if (!id) return "–";
    const b = state.batches.get(id);
    return b ? b.name : id.slice(0, 8) + "…";
  }

  function jobRow() {
    const tr = el("tr");
    const p = { img: el("img"), a: el("a", null, "shot"), station: el("td"), status: el("td"), bar: el("progress"),
                pct: el("span", null, "pct"), stage: el("td"), gpus: el("td"), elapsed: el("td"), eta: el("td"),
                batch: el("td", null, "batch") };
    p.img.alt = "preview"; p.img.hidden = true; p.bar.max = 1;
    const cell = (cls, ...kids) => { const td = el("td", null, cls); td.append(...kids); return td; };
    tr.append(cell("thumb", p.img), cell("name", p.a), p.station, p.status, cell("", p.bar, " ", p.pct), p.stage,
              p.gpus, p.elapsed, p.eta, p.batch);
    rowParts.set(tr, p);
    return tr;
  }

  function updateRow(tr, job) {
    const p = rowParts.get(tr);
    tr.dataset.jobId = job.id; tr.dataset.status = job.status;
    const name = shotName(job);
    setText(p.a, name); setTitle(p.a, name);
    const href = "/dashboard/jobs/" + encodeURIComponent(job.id);
    if (p.a.getAttribute("href") !== href) p.a.href = href;
    setText(p.station, job.station);
    setText(p.status, job.status);
    if (p.status.className !== "status s-" + job.status) p.status.className = "status s-" + job.status;
    setProgress(p.bar, job.progress, "progress " + pct(job.progress));
    setText(p.pct, pct(job.progress));
    setText(p.stage, job.stage); setText(p.gpus, gpus(job));
    setText(p.elapsed, fmtDuration(elapsed(job))); setText(p.eta, fmtDuration(eta(job)));
    setText(p.batch, batchLabel(job.batch)); setTitle(p.batch, job.batch || "");
    loadPreview(job, p.img).catch(() => {});
  }

  function newestFirst(a, b) {
    if (a.created_at !== b.created_at) return a.created_at < b.created_at ? 1 : -1;
    return a.id < b.id ? 1 : -1;
  }

  function renderJobs() {
    const jobs = [...state.jobs.values()].sort(newestFirst);
    syncChildren(document.querySelector("#jobs tbody"), jobs, (j) => j.id, jobRow, updateRow);
    if (state.cursor === null) return;  // not loaded yet (or the load failed): no count to tell
    setText($("jobs-status"), state.older ? "Showing the newest " + jobs.length + " job(s); older ones are not loaded." : jobs.length + " job(s).");
    $("jobs-updated").textContent = "Updated " + new Date().toLocaleTimeString();  // not aria-live: it changes each poll
    $("older").hidden = !state.older;
  }

  function pageSize() {  // ?limit=N on the page's URL (1–200) sets how many jobs a page loads
    const n = parseInt(new URLSearchParams(location.search).get("limit"), 10);
    return n >= 1 && n <= 200 ? n : 100;
  }

  function filterQuery(withStatus) {
    const p = new URLSearchParams();
    if (withStatus && $("f-status").value) p.set("status", $("f-status").value);
    if ($("f-station").value.trim()) p.set("station", $("f-station").value.trim());
    if ($("f-search").value.trim()) p.set("q", $("f-search").value.trim());
    return p;
  }

  // A filter changed: forget the rows and load the first page again.
  function refilter() {
    state.view += 1; state.jobs.clear(); state.cursor = null; state.older = null;
    setText($("jobs-status"), ""); $("jobs-updated").textContent = ""; $("older").hidden = true;
    renderJobs();
    pollJobs().then(renderJobs);
  }

  // The list becomes this page (a first load, or a reload after many new jobs); the previews of the jobs it leaves
  // out are let go.
  function replaceJobs(s, jobs) {
    const keep = new Set(jobs.map((j) => j.id));
    for (const [id, p] of s.previews) if (!keep.has(id)) { if (p.url) URL.revokeObjectURL(p.url); s.previews.delete(id); }
    s.jobs.clear();
    for (const j of jobs) s.jobs.set(j.id, j);
    s.paged = jobs.length;
  }

  function oldestLoaded() { let o = null; for (const j of state.jobs.values()) if (!o || newestFirst(j, o) > 0) o = j; return o; }

  // The first load takes the change cursor, then one page of GET /v1/jobs (with the status filter, on the server);
  // later polls ask the change feed without the status filter, so a job that leaves the chosen status drops out.
  async function pollJobs() {
    const s = state, view = s.view;
    if (s.loading === view) return;  // the load for this view is still running
    s.loading = view;
    try {
      const want = $("f-status").value;
      if (s.cursor === null) {
        const cursor = (await json("/v1/jobs/changes?" + filterQuery(true) + "&limit=1")).cursor;
        const page = await json("/v1/jobs?" + filterQuery(true) + "&limit=" + pageSize());
        if (s !== state || view !== s.view) return;
        replaceJobs(s, page.jobs);
        s.older = page.next_cursor; s.cursor = cursor;
      } else {
        const data = await json("/v1/jobs/changes?" + filterQuery(false) + "&since=" + encodeURIComponent(s.cursor));
        if (s !== state || view !== s.view) return;
        const oldest = oldestLoaded();
        for (const j of data.jobs) {
          if (want && j.status !== want) s.jobs.delete(j.id);
          // A job older than the loaded pages stays out until "Show older jobs" reaches it.
          else if (s.jobs.has(j.id) || !s.older || !oldest || newestFirst(j, oldest) < 0) s.jobs.set(j.id, j);
        }
        s.cursor = data.cursor;
        // New jobs join at the top while the page stays open (a night's batch): a page more than were loaded, and
        // the next poll starts again from the newest page, so rows and previews stay bounded (found from outside:
        // 1,500 shots arriving left 1,600 rows, each row's preview kept).
        if (s.jobs.size > s.paged + pageSize()) s.cursor = null;
      }
      showBanner("");
    } catch (e) {
      if (e instanceof Stale || s !== state || view !== s.view) return;
      if (s.cursor === null) { s.jobs.clear(); setText($("jobs-status"), ""); }  // no rows from an earlier filter
      showBanner("Could not load jobs: " + e.message);
    } finally {
      if (s.loading === view) s.loading = null;
    }
  }

  async function showOlder() {
    const s = state, view = s.view;
    if (!s.older) return;
    try {
      const page = await json("/v1/jobs?" + filterQuery(true) + "&limit=" + pageSize() + "&cursor=" + encodeURIComponent(s.older));
      if (s !== state || view !== s.view) return;
      for (const j of page.jobs) if (!s.jobs.has(j.id)) s.jobs.set(j.id, j);
      s.older = page.next_cursor; s.paged += page.jobs.length;
      renderJobs();
    } catch (e) { if (!(e instanceof Stale)) showBanner("Could not load older jobs: " + e.message); }
  }

  // ---- workers, queues, batches ----------------------------------------------------------------------------
  function workerState(x) {
    if (x.kind === "coordinator") return "coordinator, " + (x.busy ? (x.jobs || []).length + " job(s)" : "idle");
    return x.busy ? "busy" : "idle";
  }

  async function pollWorkers(s) {
    const wBody = $("workers").querySelector("tbody"), qBody = $("queues").querySelector("tbody");
    try {
      const w = await json("/v1/workers");
      wBody.replaceChildren(...w.workers.map((x) => {
        const tr = el("tr");
        const beat = x.last_heartbeat ? fmtDuration((Date.now() - Date.parse(x.last_heartbeat)) / 1000) + " ago" : "–";
        tr.append(el("td", x.name), el("td", x.host), el("td", x.gpu), el("td", workerState(x)),
          el("td", x.shards && x.shards.length ? x.shards.join(", ") : (x.current_shard === null ? "–" : x.current_shard)), el("td", Math.round(x.memory_mb) + " MB"), el("td", beat));
        return tr;
      }));
      qBody.replaceChildren(...Object.entries(w.queues).map(([q, d]) => {
        const tr = el("tr"); tr.append(el("td", q), el("td", d.interactive || 0), el("td", d.batch || 0)); return tr;
      }));
      for (const id of ["workers-error", "queues-error"]) { setText($(id), ""); $(id).hidden = true; }
    } catch (e) {
      if (e instanceof Stale || s !== state) return;
      // Rows from before the outage would look live ("idle, 1s ago"): drop them and say why.
      wBody.replaceChildren(); qBody.replaceChildren();
      for (const id of ["workers-error", "queues-error"]) { setText($(id), "Workers and queues unavailable: " + e.message); $(id).hidden = false; }
    }
  }

  function batchItem() {
    const li = el("li", null, "batch");
    const p = { name: el("strong", null, "batch-name"), status: el("span", null, "muted"), bar: el("progress"),
                counts: el("span"), when: el("span", null, "muted"), report: el("button", "Report (CSV)"),
                cancel: el("button", "Cancel batch") };
    p.bar.max = 1; p.report.type = "button"; p.cancel.type = "button";
    p.report.addEventListener("click", () => {
      const b = state.batches.get(li.dataset.key);
      download("/v1/batches/" + encodeURIComponent(li.dataset.key) + "/report?format=csv", "batch-" + (b ? b.name : li.dataset.key) + ".csv");
    });
    p.cancel.addEventListener("click", () => cancelBatch(li.dataset.key));
    const line = el("div", null, "batch-line"); line.append(p.bar, p.counts, p.when);
    const actions = el("div", null, "batch-actions"); actions.append(p.report, p.cancel);
    li.append(p.name, " ", p.status, line, actions);
    rowParts.set(li, p);
    return li;
  }

  function updateBatch(li, b) {
    const p = rowParts.get(li), c = b.counts || {}, done = c.done || 0;
    setText(p.name, b.name); setTitle(p.name, b.name);
    // an unsealed batch: its station is still uploading shots, so it cannot end yet (POST /v1/batches/{id}/seal)
    setText(p.status, b.status + (b.sealed === false && BATCH_OPEN.includes(b.status) ? " · uploading" : ""));
    const value = b.total ? done / b.total : 0;
    setProgress(p.bar, value, "done " + pct(value));
    const extra = ["failed", "cancelled", "not_run"].filter((k) => c[k]).map((k) => c[k] + " " + k.replace("_", " "));
    setText(p.counts, done + "/" + b.total + " done" + (extra.length ? " · " + extra.join(" · ") : ""));
    let when = "";
    if (b.status === "running" && b.eta) when = "ETA " + fmtDuration((Date.parse(b.eta) - Date.now()) / 1000);
    else if (b.status === "scheduled" && b.not_before) when = "starts " + new Date(b.not_before).toLocaleString();
    setText(p.when, when);
    p.cancel.hidden = !BATCH_OPEN.includes(b.status);
  }

  async function cancelBatch(id) {
    try { await json("/v1/batches/" + encodeURIComponent(id) + "/cancel", { method: "POST" }); await pollBatches(state); }
    catch (e) { if (!(e instanceof Stale)) showBanner("Could not cancel the batch: " + e.message); }
  }

  async function pollBatches(s) {
    const empty = $("batches-empty");
    try {
      const r = await api("/v1/batches");
      if (r.status === 404) { setText(empty, "Batches are not available on this server."); empty.hidden = false; return; }
      if (!r.ok) throw await failure(r);
      const items = (await r.json()).batches;
      if (s !== state) return;
      s.batches = new Map(items.map((b) => [b.id, b]));
      setText(empty, "No batches."); empty.hidden = items.length > 0;
      syncChildren($("batches"), items, (b) => b.id, batchItem, updateBatch);
    } catch (e) {
      if (e instanceof Stale || s !== state) return;
      setText(empty, "Could not load batches: " + e.message); empty.hidden = false;
    }
  }

  // One loop per sign-in: it stops as soon as `state` is another sign-in's.
  async function jobsLoop(s) {
    await Promise.all([pollJobs(), pollWorkers(s), pollBatches(s)]);
    if (s !== state) return;
    renderJobs();  // after the batches, so the Batch column has their names
    s.timer = setTimeout(() => jobsLoop(s), POLL_MS);
  }

  // ---- job detail ------------------------------------------------------------------------------------------
  function timeline(job) {
    const box = $("timeline");
    const shards = job.shards.filter((s) => s.started_at);
    if (!shards.length) {
      const text = ended(job) ? "No shard ran: " + ended(job) + "." : "No shard has started yet.";
      if (box.textContent !== text) box.replaceChildren(el("p", text, "muted"));
      return;
    }
    const NS = "http://www.w3.org/2000/svg";
    const lane = (s) => (s.gpu || "?") + " · " + (s.worker || "?");
    const lanes = [...new Set(shards.map(lane))].sort();
    const t0 = Math.min(...shards.map((s) => Date.parse(s.started_at)));
    const t1 = Math.max(...shards.map((s) => (s.finished_at ? Date.parse(s.finished_at) : Date.now())));
    const span = Math.max(t1 - t0, 1), W = 900, left = 200, rowH = 26, H = lanes.length * rowH + 30;
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("viewBox", "0 0 " + W + " " + H); svg.setAttribute("class", "timeline");
    const text = (x, y, s, cls) => { const t = document.createElementNS(NS, "text"); t.setAttribute("x", x); t.setAttribute("y", y); if (cls) t.setAttribute("class", cls); t.textContent = s; return t; };
    lanes.forEach((l, i) => svg.append(text(4, i * rowH + 18, l, "lane")));
    for (const s of shards) {
      const a = Date.parse(s.started_at), b = s.finished_at ? Date.parse(s.finished_at) : Date.now();
      const r = document.createElementNS(NS, "rect");
      r.setAttribute("x", left + (a - t0) / span * (W - left - 10)); r.setAttribute("y", lanes.indexOf(lane(s)) * rowH + 4);
      r.setAttribute("width", Math.max(2, (b - a) / span * (W - left - 10))); r.setAttribute("height", rowH - 8);
      r.setAttribute("class", "shard p" + (s.phase % 4) + " st-" + s.status);
      const tip = document.createElementNS(NS, "title");
      tip.textContent = "phase " + s.phase + " " + s.kind + " " + s.index + ": " + fmtDuration((b - a) / 1000) + " (" + s.status + ")";
      r.append(tip); svg.append(r);
    }
    svg.append(text(left, H - 6, "0s", "axis"), text(W - 60, H - 6, fmtDuration(span / 1000), "axis"));
    box.replaceChildren(svg);
  }

  function plainError(msg) {
    if (!msg) return "";
    if (msg.startsWith("decode failed")) return "The RAW file could not be read: " + msg.replace(/^decode failed:\s*/, "");
    return msg;
  }

  function renderText(job) {
    const r = job.render;
    if (!r) return ended(job) ? "Not decided: " + ended(job) + " first." : "Decided at ingest.";
    const pkg = r.package.replace(/\.strata$/, "");
    const parts = [pkg + (r.orientations > 1 ? " × " + r.orientations + " orientations" : "")];
    if (r.frames > 1) parts.push(r.frames + "-frame stack" + (r.frames_package ? " (frames: " + r.frames_package.replace(/\.strata$/, "") + ")" : ""));
    parts.push(r.snr_db === null ? "noise-free" : "SNR " + r.snr_db.toFixed(1) + " dB at 18 % grey");
    return parts.join(" · ");
  }

  function renderDownloads(job) {
    const box = $("downloads");
    const key = JSON.stringify([job.files_removed_at, job.outputs.map((o) => o.url), job.status]);
    if (box.dataset.key === key) return;  // unchanged: keep the buttons (and a focused one)
    box.dataset.key = key;
    let items;
    if (job.files_removed_at) items = [el("li", "Files removed " + new Date(job.files_removed_at).toLocaleString() + " (retention, or a removal through the API).", "muted")];
    else if (job.outputs.length) items = job.outputs.map((o) => {
      const li = el("li"); const b = el("button", "Download " + o.name, "download"); b.type = "button"; b.title = o.name;
      b.addEventListener("click", () => download(o.url, o.name)); li.append(b, el("span", " " + (o.bytes / 1048576).toFixed(1) + " MB", "muted")); return li;
    });
    else items = [el("li", ended(job) ? "No outputs: " + ended(job) + "." : "None yet.", "muted")];
    box.replaceChildren(...items);
  }

  function renderJob(job) {
    const name = shotName(job);
    setText($("job-name"), name); setTitle($("job-name"), name);
    setText($("job-summary"), job.status + (job.stage && job.stage !== job.status ? " · " + job.stage : "") + " · station " + job.station);
    setText($("job-progress"), "· " + pct(job.progress) + " · elapsed " + fmtDuration(elapsed(job)) + (eta(job) ? " · ETA " + fmtDuration(eta(job)) : ""));
    $("job-error").hidden = !job.error; setText($("job-error"), plainError(job.error));
    renderDownloads(job);
    $("frames").replaceChildren(...job.frames.map((f) => el("li", frameName(f) + " (" + (f.bytes / 1048576).toFixed(1) + " MB)")));
    setText($("render-info"), renderText(job));
    $("cancel").hidden = false;
    $("cancel").disabled = !ACTIVE.includes(job.status);
    timeline(job);
    if (job.files_removed_at) { $("job-preview").hidden = true; setText($("preview-caption"), "The preview went with the files."); }
    else if (!job.preview_url && ended(job)) { $("job-preview").hidden = true; setText($("preview-caption"), "No preview: " + ended(job) + "."); }
  }

  async function jobLoop(s) {
    const id = document.body.dataset.jobId;
    try {
      const job = await json("/v1/jobs/" + encodeURIComponent(id));
      renderJob(job);
      await loadPreview(job, $("job-preview"), $("preview-caption"));
      if (s !== state) return;
      s.retry = 0; showBanner("");
      if (ACTIVE.includes(job.status)) s.timer = setTimeout(() => jobLoop(s), 1000);
    } catch (e) {
      if (e instanceof Stale || s !== state) return;
      if (e.status === 404) { showBanner("This job does not exist or is not visible to this token."); $("cancel").hidden = true; return; }
      // The service may be restarting: try again after 1 s, 2 s, 4 s … at most 10 s apart, until it answers.
      const wait = Math.min(10, 2 ** s.retry); s.retry += 1;
      showBanner("Could not load the job: " + e.message + ". Trying again in " + wait + " s.");
      s.timer = setTimeout(() => jobLoop(s), wait * 1000);
    }
  }

  async function download(url, name) {
    try {
      const r = await api(url);
      if (!r.ok) throw await failure(r);
      const a = el("a"); a.href = URL.createObjectURL(await r.blob()); a.download = name;
      document.body.append(a); a.click(); a.remove();
      setTimeout(() => URL.revokeObjectURL(a.href), 60000);
    } catch (e) { if (!(e instanceof Stale)) showBanner("Download failed: " + e.message); }
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("signin-form").addEventListener("submit", (e) => {
      e.preventDefault();
      sessionStorage.setItem(KEY, $("token").value.trim()); $("token").value = ""; start();
    });
    $("signout").addEventListener("click", () => signOut(""));
    if ($("filters")) {  // the jobs page; listeners once per page, not once per sign-in
      let debounce = null;
      const later = () => { clearTimeout(debounce); debounce = setTimeout(refilter, 250); };
      $("f-status").addEventListener("change", refilter);
      for (const id of ["f-station", "f-search"]) $(id).addEventListener("input", later);
      $("filters").addEventListener("submit", (e) => { e.preventDefault(); later(); });
      $("older").addEventListener("click", showOlder);
    }
    const cancel = $("cancel");
    if (cancel) cancel.addEventListener("click", async () => {
      const s = state;
      try {
        await json("/v1/jobs/" + encodeURIComponent(document.body.dataset.jobId) + "/cancel", { method: "POST" });
        clearTimeout(s.timer); jobLoop(s);  // one loop: the pending poll is replaced, not doubled
      } catch (e) { if (!(e instanceof Stale)) showBanner("Could not cancel: " + e.message); }
    });
    if (sessionStorage.getItem(KEY)) start(); else signOut("");
  });
})();
