(function () {
  var tables = document.querySelectorAll('table.sortable');
  function order(row) { return +row.getAttribute('data-i'); }
  function sortBy(th) {
    var tbody = th.closest('table').tBodies[0], heads = th.parentNode.children;
    var col = Array.prototype.indexOf.call(heads, th), numeric = th.getAttribute('data-type') === 'num';
    var was = th.getAttribute('aria-sort');
    var next = was === 'ascending' ? 'descending' : was === 'descending' ? 'none' : 'ascending';
    for (var h = 0; h < heads.length; h++) heads[h].setAttribute('aria-sort', 'none');
    th.setAttribute('aria-sort', next);
    var dir = next === 'descending' ? -1 : 1;
    var rows = Array.prototype.slice.call(tbody.rows);
    rows.sort(function (a, b) {
      if (next === 'none') return order(a) - order(b);
      var x = a.cells[col] && a.cells[col].getAttribute('data-v');
      var y = b.cells[col] && b.cells[col].getAttribute('data-v');
      if (x === null || y === null) return x === y ? order(a) - order(b) : (x === null ? 1 : -1);
      var c = numeric ? parseFloat(x) - parseFloat(y)
                      : x.localeCompare(y, undefined, {numeric: true, sensitivity: 'base'});
      return c ? dir * c : order(a) - order(b);
    });
    for (var i = 0; i < rows.length; i++) tbody.appendChild(rows[i]);
  }
  Array.prototype.forEach.call(tables, function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th) {
      th.title = 'sort by ' + th.textContent;
      th.addEventListener('click', function () { sortBy(th); });
      th.addEventListener('keydown', function (e) {
        if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); sortBy(th); }
      });
    });
  });
  // Figures: one wider than the page shrinks to it, but never below MIN_SCALE of its own size (a grid of heatmaps
  // would become unreadable; the figure scrolls sideways instead). A click, or Enter, shows it at its own size over
  // the page (the same data URI: nothing is loaded); a click anywhere or Escape closes it.
  var MIN_SCALE = 0.75;
  var box = document.createElement('div'), shut = document.createElement('button');
  var note = document.createElement('p'), big = document.createElement('img'), opener = null;
  box.id = 'lightbox'; box.className = 'lightbox'; box.hidden = true;
  box.setAttribute('role', 'dialog'); box.setAttribute('aria-modal', 'true');
  box.setAttribute('aria-label', 'figure at full size');
  shut.type = 'button'; shut.textContent = '\u00d7'; shut.setAttribute('aria-label', 'close');
  box.appendChild(shut); box.appendChild(note); box.appendChild(big);
  document.body.appendChild(box);
  function close() {
    if (box.hidden) return;
    box.hidden = true;
    big.removeAttribute('src');
    document.body.classList.remove('lightbox-open');
    if (opener) opener.focus();
  }
  function enlarge(img) {
    var caption = img.parentNode.querySelector('figcaption');
    opener = img;
    big.src = img.src; big.alt = img.alt;
    note.textContent = caption ? caption.textContent : '';
    box.hidden = false;
    document.body.classList.add('lightbox-open');
    shut.focus();
  }
  box.addEventListener('click', close);
  document.addEventListener('keydown', function (e) { if (e.key === 'Escape') close(); });
  Array.prototype.forEach.call(document.querySelectorAll('figure img'), function (img) {
    img.tabIndex = 0;
    img.setAttribute('role', 'button');
    img.title = 'click to enlarge (Esc closes)';
    img.addEventListener('click', function () { enlarge(img); });
    img.addEventListener('keydown', function (e) {
      if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); enlarge(img); }
    });
    function floor() { if (img.naturalWidth) img.style.minWidth = Math.round(img.naturalWidth * MIN_SCALE) + 'px'; }
    if (img.complete) floor(); else img.addEventListener('load', floor);
  });
  document.documentElement.className += ' js';
  document.body.setAttribute('data-sortable-tables', String(tables.length));
})();
