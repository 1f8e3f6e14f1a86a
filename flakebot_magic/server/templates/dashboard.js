// The dashboard's behaviour: Stop buttons, and the status column kept current. `API` (the tools' URL) is set by
// dashboard.html; a tool's name is read from its row's data-name, never written into code.
const xsrf = document.querySelector('meta[name=xsrf]').content;
const row = (name, part) => document.querySelector(`tr.tool[data-name="${CSS.escape(name)}"] ${part}`);
async function stopTool(button, name) {
  button.disabled = true;
  const r = await fetch(`${API}/${encodeURIComponent(name)}/stop`,
                        {method: 'POST', headers: {'X-XSRFToken': xsrf}, credentials: 'same-origin'});
  const body = await r.json().catch(() => ({}));
  row(name, '.message').textContent = body.message || r.statusText;
  refresh();
}
for (const button of document.querySelectorAll('button.stop')) {
  button.addEventListener('click', () => stopTool(button, button.dataset.name));
}
async function refresh() {
  const r = await fetch(API, {credentials: 'same-origin'});
  if (!r.ok) return;
  const names = [];
  for (const tool of (await r.json()).tools) {
    names.push(tool.name);
    const cell = row(tool.name, '.status');
    if (cell) { cell.textContent = tool.status; cell.dataset.status = tool.status; }
    const stop = row(tool.name, 'button.stop');
    if (stop) { stop.disabled = tool.status !== 'running'; }
  }
  const shown = JSON.parse(document.getElementById('flakebot-tools').textContent).map(tool => tool.name);
  if (names.join() !== shown.join()) location.reload();
}
setInterval(refresh, 5000);
