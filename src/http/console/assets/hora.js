// Shows every <time datetime="…"> in the browser's own time zone. Without it the page
// still reads: the times are written in UTC.
document.querySelectorAll("time[datetime]").forEach(function (el) {
  var at = new Date(el.getAttribute("datetime"));
  if (!isNaN(at)) {
    el.title = el.textContent;
    el.textContent = at.toLocaleString(undefined, {
      year: "numeric", month: "2-digit", day: "2-digit",
      hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short"
    });
  }
});
