// Strata dashboard: plain JS, no build step. Data comes from the v1 API with the pasted token as a Bearer
// header; every server string is put in the page with textContent (never innerHTML).
"use strict";
(function () {
  const KEY = "strata.token";
  const $ = (id) => document.getElementById(id);
  const state = { me: null, jobs: new Map(), cursor: null, previews: new Map(), timer: null };

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  async function api(path, opts) {
    const token = sessionStorage.getItem(KEY);
    const headers = Object.assign({ Authorization: "Bearer " + token }, (opts && opts.headers) || {});
    const r = await fetch(path, Object.assign({}, opts || {}, { headers }));
    if (r.status === 401) { signOut("That token was not accepted (wrong, revoked or expired). Paste a valid token."); throw new Error("401"); }
    return r;
  }

  async function json(path, opts) {
    const r = await api(path, opts);
    if (!r.ok) {
      let detail = r.statusText;
      try { detail = (await r.json()).detail; } catch (e) { /* not JSON */ }
      const err = new Error(detail); err.status = r.status; throw err;
    }
    return r.json();
  }

  function showBanner(msg) { const b = $("banner"); b.textContent = msg || ""; b.hidden = !msg; }

  function signOut(message) {
    sessionStorage.removeItem(KEY);
    if (state.timer) clearTimeout(state.timer);
    $("app").hidden = true; $("signout").hidden = true; $("who").textContent = "";
    $("signin").hidden = false;
    $("signin-error").textContent = message || "";
    $("token").focus();
  }

  async function signIn() {
    try {
      state.me = await json("/v1/me");
    } catch (e) { if (e.message !== "401") signOut("Could not reach the service: " + e.message); return false; }
    $("signin").hidden = true; $("app").hidden = false; $("signout").hidden = false;
    $("who").textContent = "Signed in as " + state.me.name + " (" + state.me.role + ")";
    return true;
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
  function gpus(job) { return [...new Set(job.shards.map((s) => s.gpu).filter(Boolean))].join(", ") || "–"; }
  function frameName(f) { return f.original_name || f.name; }
  function shotName(job) { return job.frames.length ? frameName(job.frames[0]) + (job.frames.length > 1 ? " (+" + (job.frames.length - 1) + ")" : "") : job.id; }

  async function loadPreview(job, img, caption) {
    if (!job.preview_url) return;
    const tag = job.preview_kind + ":" + job.updated_at;
    const known = state.previews.get(job.id);
    if (known && known.tag === tag) { if (img.src !== known.url) img.src = known.url; img.hidden = false; return; }
    const r = await api(job.preview_url, { cache: "no-cache" });  // revalidate (ETag): the preview is replaced
    if (!r.ok) return;
    const url = URL.createObjectURL(await r.blob());
    if (known) URL.revokeObjectURL(known.url);
    state.previews.set(job.id, { tag, url });
    img.src = url; img.hidden = false;
    img.dataset.kind = job.preview_kind;
    if (caption) caption.textContent = job.preview_kind === "final" ? "Preview of the final render." : "Quick preview (before the render).";
  }

  function progressBar(job) {
    const p = el("progress"); p.max = 1; p.value = job.progress;
    p.setAttribute("aria-label", "progress " + Math.round(job.progress * 100) + "%");
    const wrap = el("span"); wrap.append(p, el("span", " " + Math.round(job.progress * 100) + "%", "pct"));
    return wrap;
  }

  function jobRow(job) {
    const tr = el("tr"); tr.dataset.jobId = job.id; tr.dataset.status = job.status;
    const thumb = el("td", null, "thumb"); const img = el("img"); img.alt = "preview"; img.hidden = true; thumb.append(img);
    const name = el("td"); const a = el("a", shotName(job), "shot"); a.href = "/dashboard/jobs/" + encodeURIComponent(job.id); name.append(a);
    const cells = [thumb, name, el("td", job.station), el("td", job.status, "status s-" + job.status)];
    const prog = el("td"); prog.append(progressBar(job)); cells.push(prog);
    cells.push(el("td", job.stage), el("td", gpus(job)), el("td", fmtDuration(elapsed(job))), el("td", fmtDuration(eta(job))), el("td", job.batch || "–"));
    tr.append(...cells);
    loadPreview(job, img).catch(() => {});
    return tr;
  }

  function renderJobs() {
    const body = document.querySelector("#jobs tbody");
    // The status filter is applied here: the change feed brings every status, so a job that leaves the filtered
    // status (running -> done) drops out instead of staying with a stale status.
    const want = $("f-status").value;
    const jobs = [...state.jobs.values()].filter((j) => !want || j.status === want)
      .sort((a, b) => (a.created_at < b.created_at ? 1 : -1));
    body.replaceChildren(...jobs.map(jobRow));
    $("jobs-status").textContent = jobs.length + " job(s); updated " + new Date().toLocaleTimeString();
  }

  function filterQuery() {
    const p = new URLSearchParams();
    if ($("f-station").value.trim()) p.set("station", $("f-station").value.trim());
    if ($("f-search").value.trim()) p.set("q", $("f-search").value.trim());
    return p;
  }

  async function pollJobs(reset) {
    const p = filterQuery();
    if (reset) { state.jobs.clear(); state.cursor = null; }
    if (state.cursor) p.set("since", state.cursor);
    try {
      const data = await json("/v1/jobs/changes?" + p.toString());
      state.cursor = data.cursor;
      for (const j of data.jobs) state.jobs.set(j.id, j);
      renderJobs(); showBanner("");
    } catch (e) { if (e.message !== "401") showBanner("Could not load jobs: " + e.message); }
  }

  async function pollPanels() {
    try {
      const w = await json("/v1/workers");
      $("workers").querySelector("tbody").replaceChildren(...w.workers.map((x) => {
        const tr = el("tr");
        const beat = x.last_heartbeat ? fmtDuration((Date.now() - Date.parse(x.last_heartbeat)) / 1000) + " ago" : "–";
        tr.append(el("td", x.name), el("td", x.host), el("td", x.gpu), el("td", x.kind === "coordinator" ? "coordinator, " + (x.busy ? (x.jobs || []).length + " job(s)" : "idle") : (x.busy ? "busy" : "idle")),
          el("td", x.shards && x.shards.length ? x.shards.join(", ") : (x.current_shard === null ? "–" : x.current_shard)), el("td", Math.round(x.memory_mb) + " MB"), el("td", beat));
        return tr;
      }));
      $("queues").querySelector("tbody").replaceChildren(...Object.entries(w.queues).map(([q, d]) => {
        const tr = el("tr"); tr.append(el("td", q), el("td", d.interactive || 0), el("td", d.batch || 0)); return tr;
      }));
    } catch (e) { /* shown by the jobs poll */ }
    try {
      const r = await api("/v1/batches");
      if (!r.ok) { $("batches-empty").textContent = r.status === 404 ? "Batches are not available on this server." : "Could not load batches."; return; }
      const data = await r.json();
      const items = data.batches || data || [];
      $("batches-empty").hidden = items.length > 0;
      $("batches").replaceChildren(...items.map((b) => {
        const li = el("li"); li.append(el("span", (b.name || b.id) + " ")); const p = el("progress"); p.max = 1; p.value = b.progress || 0; li.append(p);
        if (b.eta_s) li.append(el("span", " ETA " + fmtDuration(b.eta_s)));
        if (b.report_url) { const a = el("a", " report"); a.href = b.report_url; li.append(a); }
        return li;
      }));
    } catch (e) { /* tolerated */ }
  }

  async function jobsLoop() {
    await Promise.all([pollJobs(false), pollPanels()]);
    state.timer = setTimeout(jobsLoop, 1500);
  }

  // ---- job detail ------------------------------------------------------------------------------------------
  function timeline(job) {
    const box = $("timeline");
    const shards = job.shards.filter((s) => s.started_at);
    if (!shards.length) { box.replaceChildren(el("p", "No shard has started yet.", "muted")); return; }
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

  function renderText(r) {
    if (!r) return "Decided at ingest.";
    const pkg = r.package.replace(/\.strata$/, "");
    const parts = [pkg + (r.orientations > 1 ? " × " + r.orientations + " orientations" : "")];
    if (r.frames > 1) parts.push(r.frames + "-frame stack" + (r.frames_package ? " (frames: " + r.frames_package.replace(/\.strata$/, "") + ")" : ""));
    parts.push(r.snr_db === null ? "noise-free" : "SNR " + r.snr_db.toFixed(1) + " dB at 18 % grey");
    return parts.join(" · ");
  }
  async function jobLoop() {
    const id = document.body.dataset.jobId;
    try {
      const job = await json("/v1/jobs/" + encodeURIComponent(id));
      $("job-name").textContent = shotName(job);
      $("job-summary").textContent = job.status + (job.stage && job.stage !== job.status ? " · " + job.stage : "") + " · " + Math.round(job.progress * 100) + "% · station " + job.station +
        " · elapsed " + fmtDuration(elapsed(job)) + (eta(job) ? " · ETA " + fmtDuration(eta(job)) : "");
      $("job-error").hidden = !job.error; $("job-error").textContent = plainError(job.error);
      $("downloads").replaceChildren(...(job.files_removed_at ? [el("li", "Files removed " + new Date(job.files_removed_at).toLocaleString() + " (retention, or a removal through the API).", "muted")]
        : job.outputs.length ? job.outputs.map((o) => {
        const li = el("li"); const b = el("button", "Download " + o.name); b.type = "button";
        b.addEventListener("click", () => download(o)); li.append(b, el("span", " " + (o.bytes / 1048576).toFixed(1) + " MB", "muted")); return li;
      }) : [el("li", "None yet.", "muted")]));
      $("frames").replaceChildren(...job.frames.map((f) => el("li", frameName(f) + " (" + (f.bytes / 1048576).toFixed(1) + " MB)")));
      $("render-info").textContent = renderText(job.render);
      $("cancel").disabled = !["queued", "running"].includes(job.status);
      timeline(job);
      if (job.files_removed_at) { $("job-preview").hidden = true; $("preview-caption").textContent = "The preview went with the files."; }
      await loadPreview(job, $("job-preview"), $("preview-caption"));
      showBanner("");
      if (["queued", "running"].includes(job.status)) state.timer = setTimeout(jobLoop, 1000);
    } catch (e) {
      if (e.message === "401") return;
      showBanner(e.status === 404 ? "This job does not exist or is not visible to this token." : "Could not load the job: " + e.message);
    }
  }

  async function download(o) {
    const r = await api(o.url); if (!r.ok) { showBanner("Download failed."); return; }
    const a = el("a"); a.href = URL.createObjectURL(await r.blob()); a.download = o.name; document.body.append(a); a.click(); a.remove();
  }

  async function start() {
    if (!(await signIn())) return;
    if (document.body.dataset.page === "job") { jobLoop(); return; }
    $("f-station-wrap").hidden = state.me.role !== "admin";
    let debounce = null;
    const refilter = () => { clearTimeout(debounce); debounce = setTimeout(() => pollJobs(true), 250); };
    $("f-status").addEventListener("change", renderJobs);
    for (const id of ["f-station", "f-search"]) $(id).addEventListener("input", refilter);
    $("filters").addEventListener("submit", (e) => { e.preventDefault(); refilter(); });
    jobsLoop();
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("signin-form").addEventListener("submit", (e) => {
      e.preventDefault();
      sessionStorage.setItem(KEY, $("token").value.trim()); $("token").value = ""; start();
    });
    $("signout").addEventListener("click", () => signOut(""));
    const cancel = $("cancel");
    if (cancel) cancel.addEventListener("click", async () => {
      try { await json("/v1/jobs/" + encodeURIComponent(document.body.dataset.jobId) + "/cancel", { method: "POST" }); jobLoop(); }
      catch (e) { showBanner("Could not cancel: " + e.message); }
    });
    if (sessionStorage.getItem(KEY)) start(); else signOut("");
  });
})();
