//! The image options a user gives (`format_options`: `decode`, `resize`,
//! `center_crop`), parsed before the dataset's columns are known; `image` binds them to
//! the columns and decodes.

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::options::{OptionValue, Options};

const KEYS: [&str; 4] = ["decode", "decode_images", "resize", "center_crop"];
pub(super) const IMAGE_EXTENSIONS: [&str; 8] =
    ["jpg", "jpeg", "png", "webp", "gif", "tif", "tiff", "bmp"];

/// Pixel layout of a decoded image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channels {
    Rgb,
    Grey,
    Rgba,
}

impl Channels {
    fn parse(key: &str, value: &OptionValue) -> Result<Self> {
        match value {
            OptionValue::Str(s) => match s.to_ascii_lowercase().as_str() {
                "rgb8" | "rgb" => Ok(Channels::Rgb),
                "l8" | "l" => Ok(Channels::Grey),
                "rgba8" | "rgba" => Ok(Channels::Rgba),
                _ => Err(bad(
                    key,
                    &format!("{s:?} is not \"rgb8\", \"l8\" or \"rgba8\""),
                )),
            },
            _ => Err(bad(
                key,
                "the channels must be \"rgb8\", \"l8\" or \"rgba8\"",
            )),
        }
    }

    pub(super) fn count(self) -> usize {
        match self {
            Channels::Rgb => 3,
            Channels::Grey => 1,
            Channels::Rgba => 4,
        }
    }
}

pub(super) fn bad(key: &str, message: &str) -> Error {
    Error::invalid_argument(format!("format_options[{key:?}]: {message}"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Resize {
    /// Exactly `(height, width)`.
    Exact(u32, u32),
    /// The shorter side to this, keeping the aspect ratio.
    Shorter(u32),
}

/// What the user asked for, before the dataset's columns are known.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageSpec {
    /// WebDataset / raw: image types (extensions) to decode, with their channels.
    pub(super) by_extension: BTreeMap<String, Channels>,
    /// Parquet / Arrow: columns to decode.
    pub(super) by_column: BTreeMap<String, Channels>,
    pub(super) resize: Option<Resize>,
    pub(super) crop: Option<(u32, u32)>,
}

/// A positive pixel count.
fn side(key: &str, value: &OptionValue) -> Result<u32> {
    match value {
        OptionValue::Int(n) if *n >= 1 && *n <= 65_535 => Ok(*n as u32),
        _ => Err(bad(
            key,
            "sizes are whole numbers of pixels from 1 to 65535",
        )),
    }
}

/// `N` or `[H, W]`.
fn size(key: &str, value: &OptionValue) -> Result<(u32, u32, bool)> {
    match value {
        OptionValue::List(items) if items.len() == 2 => {
            Ok((side(key, &items[0])?, side(key, &items[1])?, true))
        }
        OptionValue::Int(_) => {
            let n = side(key, value)?;
            Ok((n, n, false))
        }
        _ => Err(bad(key, "give a size as N or [height, width]")),
    }
}

impl ImageSpec {
    /// Takes the image options out of `options` (so that the format's own option reader
    /// never sees them); `None` when there are none. `format` is the dataset's format.
    pub fn take(format: &str, options: &mut Options) -> Result<Option<Self>> {
        let mut taken: BTreeMap<&str, OptionValue> = BTreeMap::new();
        for key in KEYS {
            if let Some(value) = options.0.remove(key) {
                taken.insert(key, value);
            }
        }
        if taken.is_empty() {
            return Ok(None);
        }
        let mut spec = ImageSpec {
            by_extension: BTreeMap::new(),
            by_column: BTreeMap::new(),
            resize: None,
            crop: None,
        };
        match (taken.get("decode"), format) {
            (None, _) => {}
            (Some(value), "webdataset" | "raw") => {
                spec.by_extension = match value {
                    OptionValue::Map(map) => map
                        .iter()
                        .map(|(ext, ch)| {
                            let ext = ext.to_ascii_lowercase();
                            if !IMAGE_EXTENSIONS.contains(&ext.as_str()) {
                                return Err(bad(
                                    "decode",
                                    &format!("{ext:?} is not one of {IMAGE_EXTENSIONS:?}"),
                                ));
                            }
                            Ok((ext, Channels::parse("decode", ch)?))
                        })
                        .collect::<Result<_>>()?,
                    other => {
                        let channels = Channels::parse("decode", other)?;
                        IMAGE_EXTENSIONS
                            .iter()
                            .map(|e| (e.to_string(), channels))
                            .collect()
                    }
                };
            }
            (Some(_), _) => {
                return Err(bad(
                    "decode",
                    &format!(
                        "{format} columns are named, not typed by extension: use decode_images={{\"column\": \"rgb8\"}}"
                    ),
                ));
            }
        }
        match (taken.get("decode_images"), format) {
            (None, _) => {}
            (Some(OptionValue::Map(map)), "parquet" | "arrow") => {
                spec.by_column = map
                    .iter()
                    .map(|(column, ch)| Ok((column.clone(), Channels::parse("decode_images", ch)?)))
                    .collect::<Result<_>>()?;
            }
            (Some(_), "parquet" | "arrow") => {
                return Err(bad("decode_images", "give {\"column\": \"rgb8\", ...}"));
            }
            (Some(_), _) => {
                return Err(bad(
                    "decode_images",
                    &format!("is for Parquet and Arrow; {format} takes decode="),
                ));
            }
        }
        let resizes = taken.contains_key("resize") || taken.contains_key("center_crop");
        if spec.by_extension.is_empty() && spec.by_column.is_empty() && resizes {
            return Err(bad(
                "resize",
                "resize and center_crop need decode= (or decode_images=) to say which images",
            ));
        }
        if let Some(value) = taken.get("resize") {
            spec.resize = Some(match size("resize", value)? {
                (h, w, true) => Resize::Exact(h, w),
                (n, _, false) => Resize::Shorter(n),
            });
        }
        if let Some(value) = taken.get("center_crop") {
            let (h, w, _) = size("center_crop", value)?;
            spec.crop = Some((h, w));
        }
        if let Some((h, w)) = spec.shape()
            && (h as u64) * (w as u64) * 4 > i32::MAX as u64
        {
            return Err(bad(
                "center_crop",
                "an image of more than 2^31 values per sample is more than one tensor holds",
            ));
        }
        Ok(Some(spec))
    }

    /// Whether it decodes no column (`decode_images={}`: not even the `Image` columns
    /// of a dataset's features).
    pub fn decodes_nothing(&self) -> bool {
        self.by_extension.is_empty() && self.by_column.is_empty()
    }

    /// The `Image` columns of the features `datasets` wrote (the `huggingface` metadata
    /// key's JSON), decoded as `datasets` decodes them on access: each into its
    /// feature's `mode` (`"L"` grey, `"RGBA"`, else RGB); none where `decode` is false.
    /// `None` where there are none among the columns read (`schema`).
    pub fn from_features(huggingface: &str, schema: &arrow_schema::Schema) -> Option<Self> {
        let by_column: BTreeMap<String, Channels> =
            super::hf_features::media_columns(huggingface, schema, "Image")
                .into_iter()
                .map(|(name, f)| {
                    let channels = match f.get("mode").and_then(|m| m.as_str()) {
                        Some("L") => Channels::Grey,
                        Some("RGBA") => Channels::Rgba,
                        _ => Channels::Rgb,
                    };
                    (name, channels)
                })
                .collect();
        (!by_column.is_empty()).then(|| ImageSpec {
            by_extension: BTreeMap::new(),
            by_column,
            resize: None,
            crop: None,
        })
    }

    /// The output images' `(height, width)`, when they have one (a crop, or an exact
    /// resize); `None`: each keeps its own (resized by its shorter side, if asked).
    pub(super) fn shape(&self) -> Option<(u32, u32)> {
        match (self.crop, self.resize) {
            (Some(crop), _) => Some(crop),
            (None, Some(Resize::Exact(h, w))) => Some((h, w)),
            (None, _) => None,
        }
    }
}
