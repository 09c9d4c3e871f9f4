#include "run_file_edits.hpp"

#include <hdf5.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "results/hdf5_util.hpp"

namespace fuzz {
namespace {

using strata::h5::Attribute;
using strata::h5::Dataset;
using strata::h5::File;
using strata::h5::Group;
using strata::h5::PropList;
using strata::h5::Space;
using strata::h5::Type;
using Object = strata::h5::Handle<H5Oclose>;

// Datasets with more elements keep their fill value: a huge dataset costs the file nothing until
// written, which is what a reader that trusts the dims must survive.
constexpr hsize_t kMaxWritten = 4096;
// The size in bytes up to which a dataset may be compact (inside its object header).
constexpr hsize_t kMaxCompactBytes = 60000;

// Numbers that break readers: NaN, infinities, out of int range, negative, zero, denormal.
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
// clang-format off
constexpr double kNumbers[] = {0, 1, 2, 3, -1, 0.5, kNaN, kInf, -kInf, 1e300, -1e300, 2147483648.0,
                               -2147483649.0, 9.3e18, 4.5e6, 1e-310};
// clang-format on
// Dimensions: the run's own (2 ranks, 3 steps, 2 tags), empty, and huge (2^40: 8 TiB of doubles).
constexpr hsize_t kDims[] = {0, 1, 2, 3, 4, 6, hsize_t(1) << 20, hsize_t(1) << 40};
constexpr int kSmallDims = 6;  // the first entries of kDims, for attributes

// The dataspace of a new object: scalar, null, or simple with `dims`; `count` elements.
struct Shape {
  H5S_class_t cls = H5S_SCALAR;
  std::vector<hsize_t> dims;
  hsize_t count = 1;
};

class Editor {
 public:
  Editor(hid_t file, const Targets& targets, FuzzedDataProvider& in)
      : file_(file), t_(targets), in_(in) {}

  void run() {
    const int edits = in_.ConsumeIntegralInRange(1, 8);
    for (int i = 0; i < edits && in_.remaining_bytes() > 0; ++i) edit_once();
  }

 private:
  // One edit. Picks are made in statement order (not as arguments, whose evaluation order C++
  // leaves open), so that an input means the same edits with every compiler.
  void edit_once() {
    const int kind = in_.ConsumeIntegralInRange(0, 9);
    if (kind <= 2) {  // an object deleted, or replaced by a dataset or a group
      const std::string path = pick_object();
      note(kind == 0 ? "delete" : kind == 1 ? "replace by a dataset" : "replace by a group", path);
      H5Ldelete(file_, path.c_str(), H5P_DEFAULT);
      if (kind == 1) make_dataset(path);
      if (kind == 2) make_group(path);
    } else if (kind == 3) {
      const std::string obj = pick_attr_target();
      set_attr(obj, pick_attr_name());
    } else if (kind == 4) {
      const auto& [obj, name] = pick_attr();
      note("delete attribute", obj, name);
      H5Adelete_by_name(file_, obj.c_str(), name.c_str(), H5P_DEFAULT);
    } else if (kind == 5) {  // a new dataset or group beside the others
      const bool dataset = in_.ConsumeBool();
      const std::string path = new_path();
      note(dataset ? "new dataset" : "new group", path);
      dataset ? make_dataset(path) : make_group(path);
    } else if (kind == 6) {
      add_link(new_path());
    } else if (kind == 7) {
      const std::string from = pick_object();
      const std::string to = new_path();
      note("move", from, to);
      H5Lmove(file_, from.c_str(), file_, to.c_str(), H5P_DEFAULT, H5P_DEFAULT);
    } else if (kind == 8) {
      rewrite_dataset(pick_object());
    } else {
      rewrite_attr(pick_attr());
    }
  }

  // FUZZ_VERBOSE=1: each edit on stderr, to see what a reproducer does.
  static void note(const char* edit, const std::string& a, const std::string& b = "") {
    static const bool verbose = std::getenv("FUZZ_VERBOSE") != nullptr;
    if (verbose) std::fprintf(stderr, "edit: %s '%s' %s\n", edit, a.c_str(), b.c_str());
  }

  template <typename T>
  const T& pick(const std::vector<T>& v) {
    return v[in_.ConsumeIntegralInRange<std::size_t>(0, v.size() - 1)];
  }
  const std::string& pick_object() { return pick(t_.objects); }
  const std::pair<std::string, std::string>& pick_attr() { return pick(t_.attrs); }
  std::string pick_attr_target() { return in_.ConsumeBool() ? pick_attr().first : pick_object(); }
  std::string pick_name() {
    return in_.ConsumeIntegralInRange(0, 3) ? pick(t_.names) : in_.ConsumeRandomLengthString(12);
  }
  std::string pick_attr_name() {
    return in_.ConsumeIntegralInRange(0, 3) ? pick_attr().second : pick_name();
  }
  std::string new_path() {
    const std::string& parent = pick_object();
    return (parent == "/" ? "" : parent) + "/" + pick_name();
  }

  Type pick_type();
  Shape pick_shape(bool small);
  Space make_space(const Shape& shape, bool extendible);
  void write_values(hid_t obj, bool is_attr, hid_t type, hsize_t count);
  void make_dataset(const std::string& path);
  void make_group(const std::string& path);
  void set_attr(const std::string& obj_path, const std::string& name);
  void add_link(const std::string& path);
  void rewrite_dataset(const std::string& path);
  void rewrite_attr(const std::pair<std::string, std::string>& attr);

  hid_t file_;
  const Targets& t_;
  FuzzedDataProvider& in_;
};

Type string_type(std::size_t size, H5T_str_t pad, H5T_cset_t cset) {
  Type t(H5Tcopy(H5T_C_S1));
  H5Tset_size(t, size);
  if (size != H5T_VARIABLE) H5Tset_strpad(t, pad);
  H5Tset_cset(t, cset);
  return t;
}

// "class 1 (8 bytes) [2 x 3]": a new object's type and shape, for FUZZ_VERBOSE.
std::string describe(hid_t type, const Shape& shape) {
  std::string text = "class " + std::to_string(int(H5Tget_class(type))) + " (" +
                     std::to_string(H5Tget_size(type)) + " bytes) ";
  if (shape.cls == H5S_NULL) return text + "null";
  if (shape.cls == H5S_SCALAR) return text + "scalar";
  std::string dims;
  for (hsize_t d : shape.dims) dims += (dims.empty() ? "" : " x ") + std::to_string(d);
  return text + "[" + dims + "]";
}

Type Editor::pick_type() {
  const auto cset = in_.ConsumeBool() ? H5T_CSET_UTF8 : H5T_CSET_ASCII;
  switch (in_.ConsumeIntegralInRange(0, 15)) {
    case 0:
      return Type(H5Tcopy(H5T_IEEE_F64LE));
    case 1:
      return Type(H5Tcopy(H5T_IEEE_F32BE));
    case 2:
      return Type(H5Tcopy(H5T_STD_I8LE));
    case 3:
      return Type(H5Tcopy(H5T_STD_U8LE));
    case 4:
      return Type(H5Tcopy(H5T_STD_I32LE));
    case 5:
      return Type(H5Tcopy(H5T_STD_I64BE));
    case 6:
      return Type(H5Tcopy(H5T_STD_U64LE));
    case 7: {  // fixed-length, padded one of three ways
      const auto pad = static_cast<H5T_str_t>(in_.ConsumeIntegralInRange(0, 2));
      return string_type(in_.ConsumeIntegralInRange(1, 32), pad, cset);
    }
    case 8:
    case 9:
      return string_type(H5T_VARIABLE, H5T_STR_NULLTERM, cset);
    case 10: {
      Type t(H5Tcreate(H5T_COMPOUND, sizeof(double) + sizeof(int)));
      H5Tinsert(t, "value", 0, H5T_NATIVE_DOUBLE);
      H5Tinsert(t, "flag", sizeof(double), H5T_NATIVE_INT);
      return t;
    }
    case 11: {
      Type t(H5Tenum_create(H5T_NATIVE_INT));
      for (int v : {0, 1}) H5Tenum_insert(t, v ? "yes" : "no", &v);
      return t;
    }
    case 12: {
      Type t(H5Tcreate(H5T_OPAQUE, in_.ConsumeIntegralInRange(1, 8)));
      H5Tset_tag(t, "junk");
      return t;
    }
    case 13:
      return Type(H5Tcopy(H5T_STD_B16LE));
    case 14: {
      const hsize_t n = 2;
      return Type(H5Tarray_create2(H5T_NATIVE_DOUBLE, 1, &n));
    }
    default:
      return in_.ConsumeBool() ? Type(H5Tvlen_create(H5T_NATIVE_INT))
                               : Type(H5Tcopy(H5T_STD_REF_OBJ));
  }
}

Shape Editor::pick_shape(bool small) {
  Shape s;
  const int kind = in_.ConsumeIntegralInRange(0, 5);
  if (kind == 0) return s;
  if (kind == 1) {
    s.cls = H5S_NULL;
    s.count = 0;
    return s;
  }
  s.cls = H5S_SIMPLE;
  const int rank = kind == 2 ? 1 : kind == 5 ? 3 : 2;
  const int last = small ? kSmallDims - 1 : int(std::size(kDims)) - 1;
  for (int i = 0; i < rank; ++i) {
    hsize_t d = kDims[in_.ConsumeIntegralInRange(0, last)];
    if (s.count > 0 && d > (hsize_t(1) << 50) / s.count) d = 1;  // at most 2^50 elements
    s.dims.push_back(d);
    s.count *= d;
  }
  return s;
}

Space Editor::make_space(const Shape& shape, bool extendible) {
  if (shape.cls != H5S_SIMPLE) return Space(H5Screate(shape.cls));
  const std::vector<hsize_t> max(shape.dims.size(), H5S_UNLIMITED);
  return Space(H5Screate_simple(int(shape.dims.size()), shape.dims.data(),
                                extendible ? max.data() : nullptr));
}

// Writes `count` values of the input to the attribute or dataset `obj` of file type `type`.
void Editor::write_values(hid_t obj, bool is_attr, hid_t type, hsize_t count) {
  if (count == 0 || count > kMaxWritten) return;
  auto write = [&](hid_t mem_type, const void* buf) {
    is_attr ? H5Awrite(obj, mem_type, buf)
            : H5Dwrite(obj, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
  };
  const H5T_class_t cls = H5Tget_class(type);
  if (cls == H5T_INTEGER || cls == H5T_FLOAT) {
    std::vector<double> v(count);
    for (double& x : v)
      x = in_.ConsumeBool()
              ? kNumbers[in_.ConsumeIntegralInRange<std::size_t>(0, std::size(kNumbers) - 1)]
              : in_.ConsumeFloatingPoint<double>();
    write(H5T_NATIVE_DOUBLE, v.data());
  } else if (cls == H5T_STRING && H5Tis_variable_str(type) > 0) {
    std::vector<std::string> s(count);
    std::vector<const char*> p;
    for (auto& x : s) p.push_back((x = in_.ConsumeRandomLengthString(24)).c_str());
    write(string_type(H5T_VARIABLE, H5T_STR_NULLTERM, H5Tget_cset(type)), p.data());
  } else if (cls != H5T_VLEN && cls != H5T_REFERENCE) {  // raw bytes, no conversion
    std::vector<char> bytes = in_.ConsumeBytes<char>(count * H5Tget_size(type));
    bytes.resize(count * H5Tget_size(type), '\0');
    write(type, bytes.data());
  }
}

void Editor::make_dataset(const std::string& path) {
  Type type = pick_type();
  const Shape shape = pick_shape(false);
  PropList dcpl(H5Pcreate(H5P_DATASET_CREATE));
  const int layout = in_.ConsumeIntegralInRange(0, 2);
  const bool chunked = layout == 1 && shape.cls == H5S_SIMPLE;
  if (chunked) {
    std::vector<hsize_t> chunk;
    for (hsize_t d : shape.dims) chunk.push_back(d == 0 ? 1 : d < 64 ? d : 64);
    H5Pset_chunk(dcpl, int(chunk.size()), chunk.data());
  } else if (layout == 2 && shape.count * H5Tget_size(type) <= kMaxCompactBytes) {
    H5Pset_layout(dcpl, H5D_COMPACT);
  }
  if (H5Tget_class(type) == H5T_FLOAT && in_.ConsumeBool()) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    H5Pset_fill_value(dcpl, H5T_NATIVE_DOUBLE, &nan);
  }
  note("  as", describe(type, shape), chunked ? "chunked" : "");
  Dataset d(H5Dcreate2(file_, path.c_str(), type, make_space(shape, chunked), H5P_DEFAULT, dcpl,
                       H5P_DEFAULT));
  if (d < 0) return;
  write_values(d, false, type, shape.count);
  if (in_.ConsumeBool()) set_attr(path, "unit");
}

void Editor::make_group(const std::string& path) {
  PropList gcpl(H5Pcreate(H5P_GROUP_CREATE));
  if (in_.ConsumeBool()) {  // as strata writes them: links and attributes in creation order
    H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
    H5Pset_attr_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
  }
  Group g(H5Gcreate2(file_, path.c_str(), H5P_DEFAULT, gcpl, H5P_DEFAULT));
  if (g >= 0 && in_.ConsumeBool()) set_attr(path, pick_attr_name());
}

void Editor::set_attr(const std::string& obj_path, const std::string& name) {
  Object obj(H5Oopen(file_, obj_path.c_str(), H5P_DEFAULT));
  if (obj < 0) return;
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  Type type = pick_type();
  const Shape shape = pick_shape(true);
  note("set attribute", obj_path, name + " " + describe(type, shape));
  Attribute a(
      H5Acreate2(obj, name.c_str(), type, make_space(shape, false), H5P_DEFAULT, H5P_DEFAULT));
  if (a >= 0) write_values(a, true, type, shape.count);
}

void Editor::add_link(const std::string& path) {
  const int kind = in_.ConsumeIntegralInRange(0, 3);
  if (kind == 0) {  // to an object, or dangling
    const std::string target = in_.ConsumeBool() ? pick_object() : pick_name();
    note("soft link", path, target);
    H5Lcreate_soft(target.c_str(), file_, path.c_str(), H5P_DEFAULT, H5P_DEFAULT);
  } else if (kind == 1) {  // a second name for an object, maybe a group inside itself
    const std::string target = pick_object();
    note("hard link", path, target);
    H5Lcreate_hard(file_, target.c_str(), file_, path.c_str(), H5P_DEFAULT, H5P_DEFAULT);
  } else {  // to this very file (open twice while reading) or to a file that does not exist
    const char* other = in_.ConsumeBool() ? "run.h5" : "absent.h5";
    const std::string target = pick_object();
    note("external link", path, other + (":" + target));
    H5Lcreate_external(other, target.c_str(), file_, path.c_str(), H5P_DEFAULT, H5P_DEFAULT);
  }
}

void Editor::rewrite_dataset(const std::string& path) {
  Dataset d(H5Dopen2(file_, path.c_str(), H5P_DEFAULT));
  if (d < 0) return;
  Type type(H5Dget_type(d));
  Space space(H5Dget_space(d));
  note("rewrite values", path);
  write_values(d, false, type, hsize_t(H5Sget_select_npoints(space)));
}

void Editor::rewrite_attr(const std::pair<std::string, std::string>& attr) {
  // Through the object: libhdf5 1.10.8 writes an attribute opened with H5Aopen_by_name(file, path)
  // into the root group's header instead (an error, or a crash when "/" has one of that name).
  Object obj(H5Oopen(file_, attr.first.c_str(), H5P_DEFAULT));
  if (obj < 0) return;
  Attribute a(H5Aopen(obj, attr.second.c_str(), H5P_DEFAULT));
  if (a < 0) return;
  Type type(H5Aget_type(a));
  Space space(H5Aget_space(a));
  note("rewrite attribute values", attr.first, attr.second);
  write_values(a, true, type, hsize_t(H5Sget_select_npoints(space)));
}

herr_t add_attr(hid_t, const char* name, const H5A_info_t*, void* data) {
  auto* t = static_cast<std::pair<Targets*, std::string>*>(data);
  t->first->attrs.emplace_back(t->second, name);
  t->first->names.emplace_back(name);
  return 0;
}

herr_t add_link(hid_t file, const char* name, const H5L_info_t*, void* data) {
  auto* t = static_cast<Targets*>(data);
  const std::string path = std::string("/") + name;
  t->objects.push_back(path);
  t->names.push_back(path.substr(path.find_last_of('/') + 1));
  return 0;
}

}  // namespace

Targets list_targets(const std::string& path) {
  Targets t;
  File file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  t.objects.push_back("/");
  H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, add_link, &t);
  for (const auto& obj : std::vector<std::string>(t.objects)) {
    std::pair<Targets*, std::string> data{&t, obj};
    H5Aiterate_by_name(file, obj.c_str(), H5_INDEX_NAME, H5_ITER_INC, nullptr, add_attr, &data,
                       H5P_DEFAULT);
  }
  for (const char* extra : {"x", "unit", "ranks", "steps", "trace", "calibration"})
    t.names.emplace_back(extra);
  return t;
}

void edit_run_file(const std::string& path, const Targets& targets, FuzzedDataProvider& input) {
  File file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  if (file < 0) return;
  Editor(file, targets, input).run();
}

}  // namespace fuzz
