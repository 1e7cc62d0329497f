// The Checkpoints page's refresh: the button, and an auto-refresh kept per browser.
(function () {
  const key = "mcp-refresh";
  const sel = document.getElementById("auto");
  document.getElementById("refresh").onclick = () => location.reload();
  sel.value = localStorage.getItem(key) || "0";
  function arm() {
    clearTimeout(window.mcpTimer);
    const s = +sel.value;
    if (s > 0) window.mcpTimer = setTimeout(() => location.reload(), s * 1000);
  }
  sel.onchange = () => { localStorage.setItem(key, sel.value); arm(); };
  arm();
})();
