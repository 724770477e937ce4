// A JavaScript program spinning in jsOuter -> jsMiddle -> jsLeaf until its own CPU time
// reaches the seconds given (argv[2]): the test is budgeted in the workload's CPU time.
'use strict';
function jsLeaf(a) {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i] * 1.0001 + (s % 7);
  return s;
}
function jsMiddle(a) {
  return jsLeaf(a) + 1;
}
function jsOuter(a, budgetUs) {
  let t = 0;
  const start = process.cpuUsage();
  for (;;) {
    for (let k = 0; k < 100; k++) t += jsMiddle(a);
    const used = process.cpuUsage(start);
    if (used.user + used.system >= budgetUs) return t;
  }
}
const a = new Float64Array(1000);
for (let i = 0; i < a.length; i++) a[i] = i;
console.log(jsOuter(a, Number(process.argv[2] || 3) * 1e6));
